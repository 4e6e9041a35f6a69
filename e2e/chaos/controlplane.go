package chaos

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/flytekube/backend/internal/devcreds"
	"github.com/flytekube/backend/internal/ports"
)

// controlPlane is etcd and kube-apiserver from the envtest assets, started here rather
// than by envtest so that the API server can be stopped and started again on the same
// etcd, address, certificate and tokens, as an outage of the API server alone.
type controlPlane struct {
	etcd, apiserver *proc
	url             string
	config          *rest.Config
	kubeconfig      string // file, for the node and the soak
	kc              *clientcmdapi.Config
}

// kubeconfigVia writes a kubeconfig that reaches the API server at addr (host:port, the
// fault proxy's) with the same certificate and token, and returns its file.
func (cp *controlPlane) kubeconfigVia(addr string) (string, error) {
	kc := cp.kc.DeepCopy()
	kc.Clusters["chaos"].Server = "https://" + addr
	path := cp.kubeconfig + "-via-proxy"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("control plane: writing the proxied kubeconfig: %w", err)
	}
	return path, nil
}

// startControlPlane starts etcd and kube-apiserver, serving TLS with the soak's
// certificate (it covers 127.0.0.1) and accepting one administrator's static token.
func startControlPlane(ctx context.Context, assets, dir, logs string, creds *devcreds.Credentials) (*controlPlane, error) {
	p, err := ports.Free(3)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, apiPort := p[0], p[1], p[2]
	kdir := filepath.Join(dir, "kube")
	if err := os.MkdirAll(kdir, 0o700); err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	token, err := randomHex(16)
	if err != nil {
		return nil, err
	}
	tokens := filepath.Join(kdir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	saKey := filepath.Join(kdir, "sa.key")
	if err := writeSigningKey(saKey); err != nil {
		return nil, err
	}

	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	cp := &controlPlane{url: "https://127.0.0.1:" + strconv.Itoa(apiPort)}
	cp.etcd = newProc("etcd", filepath.Join(assets, "etcd"), logs, nil,
		"--data-dir", filepath.Join(kdir, "etcd"), "--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(etcdPeer), "--unsafe-no-fsync")
	cp.apiserver = newProc("kube-apiserver", filepath.Join(assets, "kube-apiserver"), logs, nil,
		"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1",
		// The loopback may not be advertised, and nothing reaches the API server through
		// the kubernetes Service here.
		"--endpoint-reconciler-type=none",
		"--secure-port", strconv.Itoa(apiPort), "--cert-dir", filepath.Join(kdir, "certs"),
		"--tls-cert-file", creds.CertFile, "--tls-private-key-file", creds.KeyFile,
		"--token-auth-file", tokens, "--authorization-mode", "RBAC",
		"--service-cluster-ip-range", "10.0.0.0/24", "--allow-privileged=true",
		// No controller manager runs to make default ServiceAccounts.
		"--disable-admission-plugins", "ServiceAccount",
		"--service-account-issuer", cp.url, "--service-account-key-file", saKey, "--service-account-signing-key-file", saKey)

	cp.config = &rest.Config{Host: cp.url, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: creds.CAFile},
		QPS: 200, Burst: 400, Timeout: 20 * time.Second}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["chaos"] = &clientcmdapi.Cluster{Server: cp.url, CertificateAuthority: creds.CAFile}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["chaos"] = &clientcmdapi.Context{Cluster: "chaos", AuthInfo: "admin"}
	kc.CurrentContext = "chaos"
	cp.kubeconfig = filepath.Join(kdir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, cp.kubeconfig); err != nil {
		return nil, fmt.Errorf("control plane: writing the kubeconfig: %w", err)
	}
	cp.kc = kc

	if err := cp.etcd.start(); err != nil {
		return nil, err
	}
	if err := cp.etcd.waitHTTP(ctx, http.DefaultClient, etcdURL+"/health", time.Minute); err != nil {
		cp.stop()
		return nil, err
	}
	if err := cp.startAPIServer(ctx); err != nil {
		cp.stop()
		return nil, err
	}
	return cp, nil
}

// startAPIServer starts kube-apiserver (again) and waits until it is ready.
func (cp *controlPlane) startAPIServer(ctx context.Context) error {
	if err := cp.apiserver.start(); err != nil {
		return err
	}
	hc, err := rest.HTTPClientFor(cp.config)
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	return cp.apiserver.waitHTTP(ctx, hc, cp.url+"/readyz", 2*time.Minute)
}

// stopAPIServer stops kube-apiserver gracefully, as an outage (etcd keeps running).
func (cp *controlPlane) stopAPIServer() { cp.apiserver.stopOnce(10 * time.Second) }

func (cp *controlPlane) stop() {
	cp.apiserver.stop(10 * time.Second)
	cp.etcd.stop(10 * time.Second)
}

// writeSigningKey writes a key the API server signs ServiceAccount tokens with.
func writeSigningKey(path string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	return nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return hex.EncodeToString(b), nil
}
