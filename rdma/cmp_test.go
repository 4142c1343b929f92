package rdma

import (
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// cmpProto compares generated protobuf structs by their exported fields.
var cmpProto = []cmp.Option{
	cmpopts.IgnoreUnexported(pluginapi.ContainerAllocateResponse{}, pluginapi.DeviceSpec{}, pluginapi.CDIDevice{}),
}
