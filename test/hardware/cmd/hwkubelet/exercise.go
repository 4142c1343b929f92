package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

// callTimeout bounds each call the kubelet makes to a plugin.
const callTimeout = 10 * time.Second

// exercise makes, for every connected resource, the calls the kubelet
// makes when a pod asks for it: GetPreferredAllocation of 1 and 2 of its
// healthy devices (when the plugin offers it), then Allocate of 1 and 2
// devices (the preferred ones when there are). PreStartContainer is never
// called: the kit is read-only and a pre-start hook may touch a device.
func exercise(ctx context.Context, k *devicemanager.Kubelet, log *slog.Logger) map[string]*Resource {
	out := map[string]*Resource{}
	for name, p := range k.Plugins() {
		if !p.Connected {
			continue
		}
		client, err := k.Client(name)
		if err != nil {
			continue
		}
		var healthy []string
		for _, d := range devicesOf(p.Devices) {
			if d.Health == pluginapi.Healthy {
				healthy = append(healthy, d.ID)
			}
		}
		r := &Resource{}
		out[name] = r
		for size := 1; size <= 2 && size <= len(healthy); size++ {
			ids := healthy[:size]
			if p.Options.GetGetPreferredAllocationAvailable() {
				call := preferred(ctx, client, healthy, size)
				r.Preferred = append(r.Preferred, call)
				if call.Error == "" && len(call.DeviceIDs) == size {
					ids = call.DeviceIDs
				}
			}
			r.Allocate = append(r.Allocate, allocate(ctx, client, ids))
		}
		log.Info("exercised resource", "resource", name, "healthy", len(healthy), "preferredCalls", len(r.Preferred), "allocateCalls", len(r.Allocate))
	}
	return out
}

func preferred(ctx context.Context, client pluginapi.DevicePluginClient, available []string, size int) PreferredCall {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	call := PreferredCall{Size: size, Available: available}
	start := time.Now()
	resp, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: available, AllocationSize: int32(size)}},
	})
	call.Seconds = time.Since(start).Seconds()
	switch {
	case err != nil:
		call.Error = err.Error()
	case len(resp.GetContainerResponses()) != 1:
		call.Error = fmt.Sprintf("%d container responses for 1 request", len(resp.GetContainerResponses()))
	default:
		call.DeviceIDs = resp.GetContainerResponses()[0].GetDeviceIDs()
	}
	return call
}

func allocate(ctx context.Context, client pluginapi.DevicePluginClient, ids []string) AllocateCall {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	call := AllocateCall{DeviceIDs: ids}
	start := time.Now()
	resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
	})
	call.Seconds = time.Since(start).Seconds()
	switch {
	case err != nil:
		call.Error = err.Error()
	case len(resp.GetContainerResponses()) != 1:
		call.Error = fmt.Sprintf("%d container responses for 1 request", len(resp.GetContainerResponses()))
	default:
		call.Response = containerResponse(resp.GetContainerResponses()[0])
	}
	return call
}
