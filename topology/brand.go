package topology

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// BrandName names an nvmlBrandType_t (nvml.h) as go-nvlib's
// GetBrandAsString does (pkg/nvlib/device/device.go, v0.12.0), which
// NVIDIA's DRA driver publishes as its brand attribute; "" for a value
// nvml.h does not define.
func BrandName(b nvml.BrandType) string {
	names := map[nvml.BrandType]string{
		nvml.BRAND_UNKNOWN: "Unknown", nvml.BRAND_QUADRO: "Quadro", nvml.BRAND_TESLA: "Tesla", nvml.BRAND_NVS: "NVS",
		nvml.BRAND_GRID: "Grid", nvml.BRAND_GEFORCE: "GeForce", nvml.BRAND_TITAN: "Titan",
		nvml.BRAND_NVIDIA_VAPPS: "NvidiaVApps", nvml.BRAND_NVIDIA_VPC: "NvidiaVPC", nvml.BRAND_NVIDIA_VCS: "NvidiaVCS",
		nvml.BRAND_NVIDIA_VWS: "NvidiaVWS", nvml.BRAND_NVIDIA_CLOUD_GAMING: "NvidiaCloudGaming",
		nvml.BRAND_QUADRO_RTX: "QuadroRTX", nvml.BRAND_NVIDIA_RTX: "NvidiaRTX", nvml.BRAND_NVIDIA: "Nvidia",
		nvml.BRAND_GEFORCE_RTX: "GeForceRTX", nvml.BRAND_TITAN_RTX: "TitanRTX",
	}
	return names[b]
}

// BrandType is the brand BrandName names name; false for a name it does
// not give.
func BrandType(name string) (nvml.BrandType, bool) {
	for b := nvml.BRAND_UNKNOWN; b < nvml.BRAND_COUNT; b++ {
		if n := BrandName(b); n != "" && n == name {
			return b, true
		}
	}
	return 0, false
}
