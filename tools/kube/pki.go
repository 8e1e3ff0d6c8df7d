package main

// The local plane's certificates: a CA, a serving certificate for 127.0.0.1
// signed by it (so kubeconfigs can verify the server instead of skipping TLS
// checks), the service-account signing key pair that TokenRequest
// (`kubectl create token`) needs, and the aggregation layer's front proxy: a
// CA of its own and the client certificate (CN front-proxy-client) that
// kube-apiserver presents to aggregated API servers, which trust that CA
// (`--requestheader-client-ca-file`) and nothing else for X-Remote-* headers.
// Made once per state directory and reused; a state directory made before the
// front proxy existed gets its front-proxy files added, the rest kept.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// frontProxyClientName is the common name of the front-proxy client
// certificate, and so the one name `--requestheader-allowed-names` admits.
const frontProxyClientName = "front-proxy-client"

type pkiFiles struct {
	caCert, caKey                             string
	servingCert, servingKey                   string
	saPrivate, saPublic                       string
	frontProxyCACert, frontProxyCAKey         string
	frontProxyClientCert, frontProxyClientKey string
	etcdCACert, etcdCAKey                     string
	etcdServerCert, etcdServerKey             string
	etcdClientCert, etcdClientKey             string
}

func ensurePKI(dir string) (pkiFiles, error) {
	f := pkiFiles{
		caCert:               filepath.Join(dir, "ca.crt"),
		caKey:                filepath.Join(dir, "ca.key"),
		servingCert:          filepath.Join(dir, "serving.crt"),
		servingKey:           filepath.Join(dir, "serving.key"),
		saPrivate:            filepath.Join(dir, "sa.key"),
		saPublic:             filepath.Join(dir, "sa.pub"),
		frontProxyCACert:     filepath.Join(dir, "front-proxy-ca.crt"),
		frontProxyCAKey:      filepath.Join(dir, "front-proxy-ca.key"),
		frontProxyClientCert: filepath.Join(dir, "front-proxy-client.crt"),
		frontProxyClientKey:  filepath.Join(dir, "front-proxy-client.key"),
		etcdCACert:           filepath.Join(dir, "etcd-ca.crt"),
		etcdCAKey:            filepath.Join(dir, "etcd-ca.key"),
		etcdServerCert:       filepath.Join(dir, "etcd-server.crt"),
		etcdServerKey:        filepath.Join(dir, "etcd-server.key"),
		etcdClientCert:       filepath.Join(dir, "etcd-apiserver-client.crt"),
		etcdClientKey:        filepath.Join(dir, "etcd-apiserver-client.key"),
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return f, err
	}
	if !allExist(f.caCert, f.caKey, f.servingCert, f.servingKey, f.saPrivate, f.saPublic) {
		if err := makeClusterPKI(f); err != nil {
			return f, err
		}
	}
	if !allExist(f.frontProxyCACert, f.frontProxyCAKey, f.frontProxyClientCert, f.frontProxyClientKey) {
		if err := makeFrontProxyPKI(f); err != nil {
			return f, err
		}
	}
	if !allExist(f.etcdCACert, f.etcdCAKey, f.etcdServerCert, f.etcdServerKey, f.etcdClientCert, f.etcdClientKey) {
		if err := makeEtcdPKI(f); err != nil {
			return f, err
		}
	}
	return f, nil
}

// makeClusterPKI writes the cluster CA, the API server's serving certificate
// and the service-account key pair.
func makeClusterPKI(f pkiFiles) error {
	ca, caKey, err := newCA("corral-dev-ca")
	if err != nil {
		return err
	}
	servingDER, servingKey, err := issue(ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP("10.96.0.1")},
		DNSNames: []string{
			"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
		},
	})
	if err != nil {
		return err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	saPublicDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}

	if err := writeCert(f.caCert, ca.Raw); err != nil {
		return err
	}
	if err := writeCert(f.servingCert, servingDER); err != nil {
		return err
	}
	if err := writePEM(f.saPublic, "PUBLIC KEY", saPublicDER); err != nil {
		return err
	}
	for path, key := range map[string]*ecdsa.PrivateKey{f.caKey: caKey, f.servingKey: servingKey, f.saPrivate: saKey} {
		if err := writeKey(path, key); err != nil {
			return err
		}
	}
	return nil
}

// makeFrontProxyPKI writes the front-proxy CA and the client certificate the
// aggregator authenticates with to aggregated API servers. It is a CA of its
// own, apart from the cluster CA: a certificate the cluster CA signs for a
// user must never be able to assert another user's identity in X-Remote-User.
func makeFrontProxyPKI(f pkiFiles) error {
	ca, caKey, err := newCA("corral-dev-front-proxy-ca")
	if err != nil {
		return err
	}
	clientDER, clientKey, err := issue(ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: frontProxyClientName},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return err
	}
	if err := writeCert(f.frontProxyCACert, ca.Raw); err != nil {
		return err
	}
	if err := writeCert(f.frontProxyClientCert, clientDER); err != nil {
		return err
	}
	if err := writeKey(f.frontProxyCAKey, caKey); err != nil {
		return err
	}
	return writeKey(f.frontProxyClientKey, clientKey)
}

// makeEtcdPKI writes etcd's own CA, its serving (and peer) certificate and
// the one client certificate kube-apiserver presents. etcd trusts only that
// CA for clients, so a local user who reaches etcd's loopback ports without
// the key (readable by the plane's owner alone) can neither read Secrets nor
// write objects past RBAC and admission.
func makeEtcdPKI(f pkiFiles) error {
	ca, caKey, err := newCA("corral-dev-etcd-ca")
	if err != nil {
		return err
	}
	serverDER, serverKey, err := issue(ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "corral-dev-etcd"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:    []string{"localhost"},
	})
	if err != nil {
		return err
	}
	clientDER, clientKey, err := issue(ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver-etcd-client"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return err
	}
	if err := writeCert(f.etcdCACert, ca.Raw); err != nil {
		return err
	}
	if err := writeCert(f.etcdServerCert, serverDER); err != nil {
		return err
	}
	if err := writeCert(f.etcdClientCert, clientDER); err != nil {
		return err
	}
	for path, key := range map[string]*ecdsa.PrivateKey{f.etcdCAKey: caKey, f.etcdServerKey: serverKey, f.etcdClientKey: clientKey} {
		if err := writeKey(path, key); err != nil {
			return err
		}
	}
	return nil
}

// newCA makes a self-signed CA certificate valid for ten years.
func newCA(commonName string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	template := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// issue signs a certificate made from template (its subject, usages and
// names) with a new key, valid for ten years; it returns the DER and the key.
func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, template *x509.Certificate) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	template.SerialNumber = serial()
	template.NotBefore = now.Add(-time.Hour)
	template.NotAfter = now.AddDate(10, 0, 0)
	der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	return der, key, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(fmt.Sprintf("reading random serial: %v", err))
	}
	return n
}

func writeCert(path string, der []byte) error {
	return writePEM(path, "CERTIFICATE", der)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func allExist(paths ...string) bool {
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}
