package main

// The local plane's certificates: a CA, a serving certificate for 127.0.0.1
// signed by it (so kubeconfigs can verify the server instead of skipping TLS
// checks) and the service-account signing key pair that TokenRequest
// (`kubectl create token`) needs. Made once per state directory and reused.

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

type pkiFiles struct {
	caCert, caKey           string
	servingCert, servingKey string
	saPrivate, saPublic     string
}

func ensurePKI(dir string) (pkiFiles, error) {
	f := pkiFiles{
		caCert:      filepath.Join(dir, "ca.crt"),
		caKey:       filepath.Join(dir, "ca.key"),
		servingCert: filepath.Join(dir, "serving.crt"),
		servingKey:  filepath.Join(dir, "serving.key"),
		saPrivate:   filepath.Join(dir, "sa.key"),
		saPublic:    filepath.Join(dir, "sa.pub"),
	}
	if allExist(f.caCert, f.caKey, f.servingCert, f.servingKey, f.saPrivate, f.saPublic) {
		return f, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return f, err
	}

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "corral-dev-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return f, err
	}

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	servingTemplate := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP("10.96.0.1")},
		DNSNames: []string{
			"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
		},
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, servingTemplate, caCert, &servingKey.PublicKey, caKey)
	if err != nil {
		return f, err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	saPublicDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return f, err
	}

	for _, w := range []struct {
		path, kind string
		der        []byte
	}{
		{f.caCert, "CERTIFICATE", caDER},
		{f.servingCert, "CERTIFICATE", servingDER},
		{f.saPublic, "PUBLIC KEY", saPublicDER},
	} {
		if err := writePEM(w.path, w.kind, w.der); err != nil {
			return f, err
		}
	}
	for path, key := range map[string]*ecdsa.PrivateKey{f.caKey: caKey, f.servingKey: servingKey, f.saPrivate: saKey} {
		der, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return f, err
		}
		if err := writePEM(path, "EC PRIVATE KEY", der); err != nil {
			return f, err
		}
	}
	return f, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(fmt.Sprintf("reading random serial: %v", err))
	}
	return n
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
