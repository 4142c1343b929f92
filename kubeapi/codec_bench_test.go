package kubeapi

import (
	"bytes"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
)

// benchNode is a GPU node as the API server sends it: GFD-style labels,
// the kubelet's conditions, capacity and the image list the kubelet
// reports (up to 50 images).
func benchNode() *corev1.Node {
	n := &corev1.Node{
		TypeMeta:   metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-0001", Labels: map[string]string{}, Annotations: map[string]string{}},
	}
	for i := range 60 {
		n.Labels[fmt.Sprintf("nvidia.com/label-%d", i)] = fmt.Sprintf("value-%d", i)
	}
	for i := range 10 {
		n.Annotations[fmt.Sprintf("node.alpha.kubernetes.io/annotation-%d", i)] = "true"
	}
	n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}
	n.Status.Capacity = corev1.ResourceList{
		corev1.ResourceCPU:    apiresource.MustParse("224"),
		corev1.ResourceMemory: apiresource.MustParse("2Ti"),
		"nvidia.com/gpu":      apiresource.MustParse("8"),
		"rdma/ib":             apiresource.MustParse("8"),
	}
	n.Status.Allocatable = n.Status.Capacity
	for _, c := range []corev1.NodeConditionType{corev1.NodeReady, corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, "GPUHealthy", "GPUPreflight"} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{
			Type: c, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory",
			Message: "kubelet has sufficient memory available", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		})
	}
	for i := range 50 {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{
			Names: []string{
				fmt.Sprintf("registry.example.com/team/image-%d@sha256:%064x", i, i),
				fmt.Sprintf("registry.example.com/team/image-%d:v1.%d", i, i),
			},
			SizeBytes: int64(i+1) << 24,
		})
	}
	return n
}

// BenchmarkNodeProtobuf decodes and encodes a Node with the protobuf
// serializer the agent's typed client negotiates (ConfigureREST): what the
// agent pays per Node it reads or writes. `make measure-api-codec` runs it
// with and without the Makefile's PRODUCT_GCFLAGS.
func BenchmarkNodeProtobuf(b *testing.B) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	codec := protobuf.NewSerializer(scheme, scheme)
	var buf bytes.Buffer
	if err := codec.Encode(benchNode(), &buf); err != nil {
		b.Fatal(err)
	}
	data := buf.Bytes()

	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			obj, _, err := codec.Decode(data, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			if n, ok := obj.(*corev1.Node); !ok || len(n.Status.Images) != 50 {
				b.Fatalf("decoded %T, not the 50-image Node", obj)
			}
		}
	})
	b.Run("encode", func(b *testing.B) {
		n := benchNode()
		var out bytes.Buffer
		for b.Loop() {
			out.Reset()
			if err := codec.Encode(n, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
}
