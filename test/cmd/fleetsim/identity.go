package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/apicount"
)

// Level-1 identities (flag -identity).
const (
	// identityToken: per node a service-account token bound to a Pod on
	// that node, under the chart's RBAC and admission policy, as the
	// DaemonSet pod authenticates.
	identityToken = "token"
	// identityCert: the admin client certificate for every agent.
	identityCert = "cert"
)

// identityManifests are the rendered chart files that make the agent's
// identity: its service account, RBAC, and the ValidatingAdmissionPolicy
// that confines each credential to the Node named in it.
var identityManifests = []string{"serviceaccount.yaml", "rbac.yaml", "validatingadmissionpolicy.yaml"}

// nodeNameExtra is the user-info extra kube-apiserver fills from the
// node of the Pod a token is bound to (ServiceAccountTokenPodNodeInfo).
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// chartIdentity is the agent identity the rendered chart creates.
type chartIdentity struct {
	sa     *corev1.ServiceAccount
	policy string
	// leaseNS and eventNS are the namespaces the policy lets the agent
	// write slot Leases and Events in (its leaseNamespace and
	// eventNamespace variables).
	leaseNS, eventNS string
}

// readManifests decodes every object in the named files of dir.
func readManifests(dir string, files ...string) ([]runtime.Object, error) {
	var out []runtime.Object
	for _, f := range files {
		text, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return nil, fmt.Errorf("read manifest: %w", err)
		}
		for _, doc := range strings.Split(string(text), "\n---\n") {
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
			if err != nil {
				return nil, fmt.Errorf("decode manifest %s: %w", f, err)
			}
			out = append(out, obj)
		}
	}
	return out, nil
}

// policyString is the string literal a policy variable's CEL expression
// is ('kube-system'), "" when the variable is absent or not a literal.
func policyString(p *admissionregistrationv1.ValidatingAdmissionPolicy, name string) string {
	for _, v := range p.Spec.Variables {
		e := strings.TrimSpace(v.Expression)
		if v.Name == name && len(e) >= 2 && e[0] == '\'' && e[len(e)-1] == '\'' {
			return e[1 : len(e)-1]
		}
	}
	return ""
}

// applyChartIdentity creates the objects of the rendered manifests in
// dir as an administrator would and returns the identity they make.
func applyChartIdentity(ctx context.Context, c kubernetes.Interface, dir string) (*chartIdentity, error) {
	objs, err := readManifests(dir, identityManifests...)
	if err != nil {
		return nil, err
	}
	id := &chartIdentity{}
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			id.sa = o
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			id.policy, id.leaseNS, id.eventNS = o.Name, policyString(o, "leaseNamespace"), policyString(o, "eventNamespace")
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			return nil, fmt.Errorf("unexpected manifest object %T in %s", o, dir)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create %T from the manifests: %w", o, err)
		}
	}
	if id.sa == nil || id.policy == "" || id.leaseNS == "" || id.eventNS == "" {
		return nil, fmt.Errorf("manifests in %s lack the service account, the policy or its leaseNamespace/eventNamespace variables", dir)
	}
	return id, nil
}

// username is the service account's user name.
func (id *chartIdentity) username() string {
	return "system:serviceaccount:" + id.sa.Namespace + ":" + id.sa.Name
}

// issueTokens creates, for each named node, a Pod of the service account
// bound to that node through spec.nodeName (no kubelet runs it: the API
// server only needs the object) and a token bound to that Pod, valid for
// expiry, 16 nodes at a time. tokens[i] is names[i]'s.
func (id *chartIdentity) issueTokens(ctx context.Context, c kubernetes.Interface, names []string, expiry time.Duration) ([]string, error) {
	tokens := make([]string, len(names))
	work := make(chan int)
	errs := make([]error, 16)
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			for i := range work {
				if errs[w] != nil {
					continue
				}
				tokens[i], errs[w] = id.issueToken(ctx, c, names[i], expiry)
			}
		})
	}
	for i := range names {
		work <- i
	}
	close(work)
	wg.Wait()
	return tokens, errors.Join(errs...)
}

func (id *chartIdentity) issueToken(ctx context.Context, c kubernetes.Interface, node string, expiry time.Duration) (string, error) {
	pod, err := c.CoreV1().Pods(id.sa.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: id.sa.Name + "-" + node, Labels: map[string]string{"app.kubernetes.io/name": id.sa.Name}},
		Spec: corev1.PodSpec{
			NodeName: node, ServiceAccountName: id.sa.Name,
			Containers: []corev1.Container{{Name: "agent", Image: "gpu-node-agent:fleetsim"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create agent pod on node %s: %w", node, err)
	}
	secs := int64(expiry / time.Second)
	tok, err := c.CoreV1().ServiceAccounts(id.sa.Namespace).CreateToken(ctx, id.sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &secs,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token request for pod %s: %w", pod.Name, err)
	}
	return tok.Status.Token, nil
}

// tokenConfig is one simulated agent's rest.Config with a bearer token
// and no client certificate; otherwise as agentConfig.
func tokenConfig(base *rest.Config, token, userAgent string, c *apicount.Counter) *rest.Config {
	rc := rest.AnonymousClientConfig(base)
	rc.BearerToken = token
	kubeapi.ConfigureREST(rc, userAgent, kubeapi.ClientConfig{})
	if c != nil {
		rc.WrapTransport = c.Wrap
	}
	rc.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	return rc
}

// waitInEffect checks that token authenticates as the service account
// with node's name as the node-name extra, then waits until the RBAC and
// the policy are in effect for it: the API server applies them once its
// informers see them. It probes with dry-run writes (admitted like real
// ones, never persisted, not counted as agent traffic) until a slot
// Lease held by another node is refused by the policy and the agent's
// own label, slot Lease and Event are allowed.
func (id *chartIdentity) waitInEffect(ctx context.Context, base *rest.Config, token, node string, timeout time.Duration) error {
	cl, err := kubernetes.NewForConfig(tokenConfig(base, token, "fleetsim/probe", nil))
	if err != nil {
		return fmt.Errorf("probe client: %w", err)
	}
	r, err := cl.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("self subject review with node %s's token: %w", node, err)
	}
	if u := r.Status.UserInfo; u.Username != id.username() || len(u.Extra[nodeNameExtra]) != 1 || u.Extra[nodeNameExtra][0] != node {
		return fmt.Errorf("node %s's token authenticates as %s %v; want %s with %s=[%s]", node, u.Username, u.Extra, id.username(), nodeNameExtra, node)
	}
	dry := []string{metav1.DryRunAll}
	lease := func(holder string) error {
		_, err := cl.CoordinationV1().Leases(id.leaseNS).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: safeguard.DefaultSlotPrefix + "-probe"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder},
		}, metav1.CreateOptions{DryRun: dry})
		return err
	}
	inEffect := func() bool {
		errOther := lease(node + "-other")
		errOwn := lease(node)
		_, errLabel := cl.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"gpu-node-agent.io/probe":"x"}}}`), metav1.PatchOptions{DryRun: dry})
		now := metav1.Now()
		_, errEvent := cl.CoreV1().Events(id.eventNS).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: node + ".probe"},
			InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node},
			Reason:         "Probe", Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "gpu-node-agent", Host: node},
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
		}, metav1.CreateOptions{DryRun: dry})
		return policyDenied(errOther) && errOwn == nil && errLabel == nil && errEvent == nil
	}
	for deadline := time.Now().Add(timeout); !inEffect(); time.Sleep(50 * time.Millisecond) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the chart's RBAC and policy %s not in effect after %s", id.policy, timeout)
		}
	}
	return nil
}

// policyDenied says whether err is a refusal by a ValidatingAdmissionPolicy.
func policyDenied(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy")
}
