package topology

import "strings"

// ExpectedNVLinks is how many NVLinks a GPU model has wired to its peers or
// NVSwitches on the boards NVIDIA builds it into (SXM modules; PCIe cards
// are bridged optionally and count 0; an unknown model counts 0). From
// NVIDIA's data sheets: V100 SXM2/SXM3 6 (NVLink 2), A100 SXM4 12 (NVLink
// 3), H100/H200 SXM5 18 (NVLink 4), B200 18 (NVLink 5). Links 0..n-1 are
// the wired ones. The health monitor's nvlink check and the preflight's
// nvlink item both expect them up.
func ExpectedNVLinks(model string) int {
	m := strings.ToUpper(model)
	switch {
	case strings.Contains(m, "PCIE"), strings.Contains(m, " NVL"):
		return 0
	case strings.Contains(m, "V100-SXM"):
		return 6
	case strings.Contains(m, "A100-SXM"):
		return 12
	case strings.Contains(m, "H100 80GB HBM3"), strings.Contains(m, "H100-SXM"), strings.Contains(m, "H200"),
		strings.Contains(m, "B200"):
		return 18
	}
	return 0
}
