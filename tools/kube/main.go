// Command corral-kube is Corral's local Kubernetes control plane: one binary
// that runs an embedded etcd and the real kube-apiserver from the Kubernetes
// Go modules, plus the matching kubectl.
//
// It exists because the machines Corral is developed and tested on have no
// container engine and cannot download prebuilt Kubernetes binaries, while
// the Go module proxy is reachable. The Python side (corral.devcluster) owns
// policy — which ports, which tokens, which authorization mode — and passes
// it through; this binary owns only the wiring: etcd, the PKI files and the
// flags that point kube-apiserver at them.
//
// Usage:
//
//	corral-kube serve --state-dir DIR --port PORT [-- KUBE-APISERVER-FLAGS...]
//	corral-kube kubectl ARGS...      (or invoke through a link named kubectl)
//	corral-kube kubelet|scheduler|controller-manager|proxy FLAGS...  (components.go)
//	corral-kube version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	if filepath.Base(os.Args[0]) == "kubectl" {
		os.Exit(runKubectl(os.Args))
	}
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		if err := serve(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "corral-kube: %v\n", err)
			os.Exit(1)
		}
	case "kubectl":
		// kubectl reads os.Args itself; make it look like it was called directly.
		os.Exit(runKubectl(append([]string{"kubectl"}, os.Args[2:]...)))
	case "version":
		fmt.Println(version.Get().GitVersion)
	default:
		if code, ok := runComponent(os.Args[1], os.Args[2:]); ok {
			os.Exit(code)
		}
		usage()
		os.Exit(2)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  corral-kube serve --state-dir DIR --port PORT [-- KUBE-APISERVER-FLAGS...]
  corral-kube kubectl ARGS...
  corral-kube kubelet|scheduler|controller-manager|proxy FLAGS...
  corral-kube version`)
}

func runKubectl(args []string) int {
	os.Args = args
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err) // prints the error the way kubectl does and exits
	}
	return 0
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	stateDir := fs.String("state-dir", "", "directory for etcd data and PKI (created if missing)")
	port := fs.Int("port", 0, "kube-apiserver secure port on 127.0.0.1")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *stateDir == "" || *port <= 0 || *port > 65535 {
		return errors.New("serve needs --state-dir DIR and --port between 1 and 65535")
	}
	passthrough := fs.Args()

	pki, err := ensurePKI(filepath.Join(*stateDir, "pki"))
	if err != nil {
		return fmt.Errorf("preparing certificates in %s: %w", *stateDir, err)
	}

	etcd, clientURL, err := startEtcd(filepath.Join(*stateDir, "etcd"), pki)
	if err != nil {
		return err
	}
	defer etcd.Close()

	apiserverArgs := append([]string{
		"--etcd-servers=" + clientURL,
		"--etcd-cafile=" + pki.etcdCACert,
		"--etcd-certfile=" + pki.etcdClientCert,
		"--etcd-keyfile=" + pki.etcdClientKey,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(*port),
		"--cert-dir=" + filepath.Join(*stateDir, "pki"),
		"--tls-cert-file=" + pki.servingCert,
		"--tls-private-key-file=" + pki.servingKey,
		"--client-ca-file=" + pki.caCert,
		"--service-account-key-file=" + pki.saPublic,
		"--service-account-signing-key-file=" + pki.saPrivate,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--api-audiences=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.96.0.0/16",
		// The aggregation layer (APIServices): aggregated API servers trust
		// X-Remote-User/-Group/-Extra-* only from a client certificate that the
		// front-proxy CA signed for front-proxy-client, the one kube-apiserver
		// presents when it proxies to them. The flags also land in the
		// kube-system/extension-apiserver-authentication ConfigMap, where
		// aggregated servers look them up.
		"--requestheader-client-ca-file=" + pki.frontProxyCACert,
		"--requestheader-allowed-names=" + frontProxyClientName,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + pki.frontProxyClientCert,
		"--proxy-client-key-file=" + pki.frontProxyClientKey,
		// No Pods or endpoints exist here: an APIService's Service is resolved
		// to its cluster IP or, for an ExternalName Service, to
		// externalName:port, which is how a server on this machine is reached
		// (ExternalName localhost), as kwok runs aggregated servers.
		"--enable-aggregator-routing=false",
	}, passthrough...)

	command := app.NewAPIServerCommand()
	command.SetArgs(apiserverArgs)
	// kube-apiserver installs its own SIGTERM/SIGINT handling and returns
	// from Execute once it has shut down; etcd is closed after it by defer.
	return command.ExecuteContext(context.Background())
}

// startEtcd runs a single-member etcd on loopback ports chosen by the kernel.
// Both ports speak TLS and demand a client certificate from etcd's own CA:
// loopback is shared by every local account, and a plain etcd there would
// hand any of them every Secret and a write path around RBAC and admission.
// fsync is off: this plane is for development and tests, where speed matters
// and a lost write after a power cut does not.
func startEtcd(dir string, pki pkiFiles) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := stickyPeerPort(filepath.Join(filepath.Dir(dir), "etcd-peer-port"))
	if err != nil {
		return nil, "", err
	}
	clientURL := url.URL{Scheme: "https", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort))}
	peerURL := url.URL{Scheme: "https", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))}

	cfg := embed.NewConfig()
	cfg.Name = "corral-dev"
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	cfg.UnsafeNoFsync = true
	cfg.ClientTLSInfo = transport.TLSInfo{
		CertFile: pki.etcdServerCert, KeyFile: pki.etcdServerKey,
		TrustedCAFile: pki.etcdCACert, ClientCertAuth: true,
	}
	cfg.PeerTLSInfo = cfg.ClientTLSInfo

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("starting etcd in %s: %w", dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, clientURL.String(), nil
	case err := <-e.Err():
		e.Close()
		return nil, "", fmt.Errorf("etcd failed: %w", err)
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", errors.New("etcd was not ready after 60s")
	}
}

// stickyPeerPort returns the peer port recorded in file, choosing and
// recording a free one on first use. etcd keeps a member's peer URL in its
// data directory, so a restarted member must come back on the same port.
func stickyPeerPort(file string) (int, error) {
	if data, err := os.ReadFile(file); err == nil {
		if port, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && port > 0 {
			return port, nil
		}
	}
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return 0, err
	}
	return port, os.WriteFile(file, []byte(strconv.Itoa(port)+"\n"), 0o600)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
