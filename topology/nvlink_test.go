package topology

import "testing"

func TestExpectedNVLinks(t *testing.T) {
	for model, want := range map[string]int{
		"Tesla V100-SXM2-32GB":    6,
		"Tesla V100-SXM3-32GB":    6,
		"NVIDIA A100-SXM4-80GB":   12,
		"NVIDIA A100-PCIE-40GB":   0,
		"NVIDIA H100 80GB HBM3":   18,
		"NVIDIA H100 PCIe":        0,
		"NVIDIA H200 141GB HBM3e": 18,
		"NVIDIA B200 180GB HBM3e": 18,
		"NVIDIA H100 NVL":         0,
		"NVIDIA L40S":             0,
	} {
		if got := ExpectedNVLinks(model); got != want {
			t.Errorf("ExpectedNVLinks(%q) = %d, want %d", model, got, want)
		}
	}
}
