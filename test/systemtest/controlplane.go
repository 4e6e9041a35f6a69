package systemtest

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

	"github.com/flytekube/backend/services/auth/devcreds"
	"github.com/flytekube/backend/test/ports"
	"github.com/flytekube/backend/test/process"
)

// ControlPlane is etcd and kube-apiserver from the envtest assets, started here rather
// than by envtest so that the API server can be stopped and started again on the same
// etcd, address, certificate and tokens, as an outage of the API server alone, and so
// that programs run as processes reach it through a kubeconfig of their own.
type ControlPlane struct {
	Etcd, APIServer *process.Process
	URL             string
	// Config is the administrator's (system:masters, by a static token).
	Config     *rest.Config
	Kubeconfig string // the administrator's, as a file, for the node and the programs
	kc         *clientcmdapi.Config
}

// KubeconfigVia writes a kubeconfig that reaches the API server at addr (host:port, a
// fault proxy's) with the same certificate and token, and returns its file.
func (cp *ControlPlane) KubeconfigVia(addr string) (string, error) {
	kc := cp.kc.DeepCopy()
	kc.Clusters[clusterName].Server = "https://" + addr
	path := cp.Kubeconfig + "-via-proxy"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("control plane: writing the proxied kubeconfig: %w", err)
	}
	return path, nil
}

// clusterName names the cluster and the context in the kubeconfigs written.
const clusterName = "local"

// StartControlPlane starts etcd and kube-apiserver from assets (KUBEBUILDER_ASSETS) with
// their files under dir and their logs in logs, serving TLS with creds' certificate (it
// covers 127.0.0.1) and accepting one administrator's static token.
func StartControlPlane(ctx context.Context, assets, dir, logs string, creds *devcreds.Credentials) (*ControlPlane, error) {
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
	cp := &ControlPlane{URL: "https://127.0.0.1:" + strconv.Itoa(apiPort)}
	cp.Etcd = process.New("etcd", filepath.Join(assets, "etcd"), logs, nil,
		"--data-dir", filepath.Join(kdir, "etcd"), "--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(etcdPeer), "--unsafe-no-fsync")
	cp.APIServer = process.New("kube-apiserver", filepath.Join(assets, "kube-apiserver"), logs, nil,
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
		"--service-account-issuer", cp.URL, "--service-account-key-file", saKey, "--service-account-signing-key-file", saKey)

	cp.Config = &rest.Config{Host: cp.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: creds.CAFile},
		QPS: 200, Burst: 400, Timeout: 20 * time.Second}
	kc := clientcmdapi.NewConfig()
	kc.Clusters[clusterName] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthority: creds.CAFile}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts[clusterName] = &clientcmdapi.Context{Cluster: clusterName, AuthInfo: "admin"}
	kc.CurrentContext = clusterName
	cp.Kubeconfig = filepath.Join(kdir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, cp.Kubeconfig); err != nil {
		return nil, fmt.Errorf("control plane: writing the kubeconfig: %w", err)
	}
	cp.kc = kc

	if err := cp.Etcd.Start(); err != nil {
		return nil, err
	}
	if err := cp.Etcd.WaitHTTP(ctx, http.DefaultClient, etcdURL+"/health", time.Minute); err != nil {
		cp.Stop()
		return nil, err
	}
	if err := cp.StartAPIServer(ctx); err != nil {
		cp.Stop()
		return nil, err
	}
	return cp, nil
}

// StartAPIServer starts kube-apiserver (again) and waits until it is ready.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	if err := cp.APIServer.Start(); err != nil {
		return err
	}
	hc, err := rest.HTTPClientFor(cp.Config)
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	return cp.APIServer.WaitHTTP(ctx, hc, cp.URL+"/readyz", 2*time.Minute)
}

// StopAPIServer stops kube-apiserver gracefully, as an outage (etcd keeps running).
func (cp *ControlPlane) StopAPIServer() { cp.APIServer.StopOnce(10 * time.Second) }

// Stop ends the API server and etcd for good.
func (cp *ControlPlane) Stop() {
	cp.APIServer.Stop(10 * time.Second)
	cp.Etcd.Stop(10 * time.Second)
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
