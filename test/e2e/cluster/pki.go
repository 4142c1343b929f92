package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
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

// pki holds the cluster's CA and the files generated from it.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  crypto.Signer

	CAFile string
	// ServingCert/Key: kube-apiserver's serving certificate.
	ServingCert, ServingKey string
	// AdminCert/Key: client certificate in system:masters.
	AdminCert, AdminKey string
	// KubeletCert/Key: the node's client certificate (system:node:<name>).
	KubeletCert, KubeletKey string
	// SAKey/SAPub: service-account token signing key pair.
	SAKey, SAPub string
}

// newPKI creates a CA and every certificate the cluster needs in dir.
func newPKI(dir, nodeName string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ca key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gpu-node-agent-e2e-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("create ca certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parse ca certificate: %w", err)
	}
	p := &pki{dir: dir, caCert: caCert, caKey: caKey, CAFile: filepath.Join(dir, "ca.crt")}
	if err := writePEM(p.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}

	p.ServingCert, p.ServingKey, err = p.issue("apiserver", pkix.Name{CommonName: "kube-apiserver"},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP(serviceAPIIP)}, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, err
	}
	p.AdminCert, p.AdminKey, err = p.issue("admin", pkix.Name{CommonName: "e2e-admin", Organization: []string{"system:masters"}},
		nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}
	p.KubeletCert, p.KubeletKey, err = p.issue("kubelet", pkix.Name{CommonName: "system:node:" + nodeName, Organization: []string{"system:nodes"}},
		nil, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generate service-account key: %w", err)
	}
	p.SAKey, p.SAPub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writePEM(p.SAKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("encode service-account public key: %w", err)
	}
	if err := writePEM(p.SAPub, "PUBLIC KEY", pub); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *pki) issue(name string, subject pkix.Name, dns []string, ips []net.IP, usage x509.ExtKeyUsage) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generate %s key: %w", name, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return "", "", fmt.Errorf("generate %s serial: %w", name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return "", "", fmt.Errorf("create %s certificate: %w", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", fmt.Errorf("encode %s key: %w", name, err)
	}
	certFile, keyFile = filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key")
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	if err := writePEM(keyFile, "EC PRIVATE KEY", keyDER); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

func writePEM(path, typ string, der []byte) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// kubeconfig writes a kubeconfig for server using a client certificate.
func writeKubeconfig(path, server, caFile, certFile, keyFile string) error {
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: e2e
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: e2e
  context:
    cluster: e2e
    user: e2e
current-context: e2e
`, server, caFile, certFile, keyFile)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}
