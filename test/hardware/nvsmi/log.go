// Package nvsmi is the part of `nvidia-smi -q -x` the hardware check kit
// reads and writes: the XML schema (nvidia_smi_log) as Go structs, a
// parser for a real capture, and Query, which answers it from an NVML
// library (the simulator's, for simsmi).
//
// Element names and order follow real `nvidia-smi -q -x` captures found in
// public repositories: driver 555.42.06 (an NVIDIA L4) and 575.51.02 (a
// GeForce RTX 4070 Laptop GPU), both declaring nvsmi_device_v12.dtd, and
// MIG devices as 575.57.08 prints them on an 80 GB GPU; R570 sits between
// them. NVIDIA's DTD itself was not found. The structs hold only the
// elements the kit compares (a subset of nvidia-smi's); a real capture's
// other elements are ignored when parsed. Values are nvidia-smi's strings
// ("81559 MiB", "41 C", "Enabled", "N/A"): the helpers below read them.
package nvsmi

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"strconv"
	"strings"
)

// NA is nvidia-smi's value for what it cannot read or the GPU lacks.
const NA = "N/A"

// Header is what nvidia-smi writes before the document.
const Header = "<?xml version=\"1.0\" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v12.dtd\">\n"

// Log is the document, <nvidia_smi_log>.
type Log struct {
	XMLName       xml.Name `xml:"nvidia_smi_log"`
	Timestamp     string   `xml:"timestamp"`
	DriverVersion string   `xml:"driver_version"`
	CUDAVersion   string   `xml:"cuda_version"`
	AttachedGPUs  string   `xml:"attached_gpus"`
	GPUs          []GPU    `xml:"gpu"`
}

// GPU is one <gpu id="BUS ID">.
type GPU struct {
	// ID is the PCI bus ID as NVML spells it ("00000000:03:00.0").
	ID              string     `xml:"id,attr"`
	ProductName     string     `xml:"product_name"`
	ProductBrand    string     `xml:"product_brand"`
	PersistenceMode string     `xml:"persistence_mode"`
	MIGMode         MIGMode    `xml:"mig_mode"`
	MIGDevices      MIGDevices `xml:"mig_devices"`
	Serial          string     `xml:"serial"`
	UUID            string     `xml:"uuid"`
	MinorNumber     string     `xml:"minor_number"`
	PCI             PCI        `xml:"pci"`
	FBMemoryUsage   Memory     `xml:"fb_memory_usage"`
	ECCMode         ECCMode    `xml:"ecc_mode"`
	ECCErrors       ECCErrors  `xml:"ecc_errors"`
	RetiredPages    Retired    `xml:"retired_pages"`
	RemappedRows    Remapped   `xml:"remapped_rows"`
	Temperature     Temp       `xml:"temperature"`
	Power           Power      `xml:"gpu_power_readings"`
	Clocks          Clocks     `xml:"clocks"`
	MaxClocks       Clocks     `xml:"max_clocks"`
}

// MIGMode is <mig_mode>: "Enabled", "Disabled" or N/A.
type MIGMode struct {
	Current string `xml:"current_mig"`
	Pending string `xml:"pending_mig"`
}

// MIGDevices is <mig_devices>: its MIG devices, or the text "None".
type MIGDevices struct {
	None    string      `xml:",chardata"`
	Devices []MIGDevice `xml:"mig_device"`
}

// MIGDevice is one <mig_device>. nvidia-smi -q -x gives no MIG UUID (-L
// does).
type MIGDevice struct {
	Index             string        `xml:"index"`
	GPUInstanceID     string        `xml:"gpu_instance_id"`
	ComputeInstanceID string        `xml:"compute_instance_id"`
	Attributes        MIGAttributes `xml:"device_attributes>shared"`
	FBMemoryUsage     Memory        `xml:"fb_memory_usage"`
}

// MIGAttributes is <device_attributes><shared>.
type MIGAttributes struct {
	Multiprocessors string `xml:"multiprocessor_count"`
	CopyEngines     string `xml:"copy_engine_count"`
	Encoders        string `xml:"encoder_count"`
	Decoders        string `xml:"decoder_count"`
	OFAs            string `xml:"ofa_count"`
	JPEGs           string `xml:"jpg_count"`
}

// PCI is <pci>.
type PCI struct {
	Bus           string   `xml:"pci_bus"`
	Device        string   `xml:"pci_device"`
	Domain        string   `xml:"pci_domain"`
	DeviceID      string   `xml:"pci_device_id"`
	BusID         string   `xml:"pci_bus_id"`
	SubSystemID   string   `xml:"pci_sub_system_id"`
	Link          PCIeLink `xml:"pci_gpu_link_info"`
	ReplayCounter string   `xml:"replay_counter"`
}

// PCIeLink is <pci_gpu_link_info>: generations as numbers, widths as
// "16x".
type PCIeLink struct {
	MaxGen       string `xml:"pcie_gen>max_link_gen"`
	CurrentGen   string `xml:"pcie_gen>current_link_gen"`
	MaxWidth     string `xml:"link_widths>max_link_width"`
	CurrentWidth string `xml:"link_widths>current_link_width"`
}

// Memory is <fb_memory_usage>, in MiB ("81559 MiB"). Reserved is R535+'s
// (nvmlDeviceGetMemoryInfo_v2).
type Memory struct {
	Total    string `xml:"total"`
	Reserved string `xml:"reserved,omitempty"`
	Used     string `xml:"used"`
	Free     string `xml:"free"`
}

// ECCMode is <ecc_mode>: "Enabled", "Disabled" or N/A.
type ECCMode struct {
	Current string `xml:"current_ecc"`
	Pending string `xml:"pending_ecc"`
}

// ECCErrors is <ecc_errors>.
type ECCErrors struct {
	Volatile  ECCCounts `xml:"volatile"`
	Aggregate ECCCounts `xml:"aggregate"`
}

// ECCCounts is <volatile> or <aggregate>. R555+ split SRAM's uncorrected
// errors into parity and SEC-DED; R535 had one sram_uncorrectable. Drivers
// before R535 counted by single_bit/double_bit instead: those are not read.
type ECCCounts struct {
	SRAMCorrectable         string `xml:"sram_correctable"`
	SRAMUncorrectable       string `xml:"sram_uncorrectable,omitempty"`
	SRAMUncorrectableParity string `xml:"sram_uncorrectable_parity,omitempty"`
	SRAMUncorrectableSECDED string `xml:"sram_uncorrectable_secded,omitempty"`
	DRAMCorrectable         string `xml:"dram_correctable"`
	DRAMUncorrectable       string `xml:"dram_uncorrectable"`
	SRAMThresholdExceeded   string `xml:"sram_threshold_exceeded,omitempty"`
}

// Corrected is the corrected errors of all locations (NVML's
// nvmlDeviceGetTotalEccErrors(CORRECTED)); why says why there is none.
func (c ECCCounts) Corrected() (n uint64, why string) {
	return sum(c.SRAMCorrectable, c.DRAMCorrectable)
}

// Uncorrected is the uncorrected errors of all locations.
func (c ECCCounts) Uncorrected() (n uint64, why string) {
	return sum(c.SRAMUncorrectable, c.SRAMUncorrectableParity, c.SRAMUncorrectableSECDED, c.DRAMUncorrectable)
}

// sum adds the counts that are numbers; why is set when none is.
func sum(vals ...string) (uint64, string) {
	var n uint64
	found := false
	for _, v := range vals {
		if x, ok := Uint(v); ok {
			n += x
			found = true
		}
	}
	if !found {
		return 0, "nvidia-smi gives no count (" + strings.Join(nonEmpty(vals), ", ") + ")"
	}
	return n, ""
}

func nonEmpty(vals []string) []string {
	var out []string
	for _, v := range vals {
		if v != "" {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return []string{"no element"}
	}
	return out
}

// Retired is <retired_pages>.
type Retired struct {
	MultipleSingleBit RetiredCause `xml:"multiple_single_bit_retirement"`
	DoubleBit         RetiredCause `xml:"double_bit_retirement"`
	PendingBlacklist  string       `xml:"pending_blacklist"`
	Pending           string       `xml:"pending_retirement"`
}

// RetiredCause is one cause's <retired_count> and page list. The list's
// content when pages are retired was not seen in an R555+ sample; the
// pre-R535 <retired_page_addresses> held one <retired_page_address> per
// page, and Query writes it that way.
type RetiredCause struct {
	Count    string   `xml:"retired_count"`
	PageList PageList `xml:"retired_pagelist"`
}

// PageList is <retired_pagelist>: N/A or the pages.
type PageList struct {
	Text      string   `xml:",chardata"`
	Addresses []string `xml:"retired_page_address"`
}

// Remapped is <remapped_rows>.
type Remapped struct {
	Corr    string `xml:"remapped_row_corr"`
	Unc     string `xml:"remapped_row_unc"`
	Pending string `xml:"remapped_row_pending"`
	Failure string `xml:"remapped_row_failure"`
}

// Temp is <temperature> ("41 C").
type Temp struct {
	GPU string `xml:"gpu_temp"`
}

// Power is <gpu_power_readings> ("259.00 W"). Up to R565 the reading was
// power_draw; R575 prints average_power_draw and instant_power_draw
// instead (see the package comment for the samples).
type Power struct {
	PowerDraw        string `xml:"power_draw,omitempty"`
	AveragePowerDraw string `xml:"average_power_draw,omitempty"`
	InstantPowerDraw string `xml:"instant_power_draw,omitempty"`
}

// Draw is the power reading nvidia-smi printed, in watts, and its element;
// why says why there is none.
func (p Power) Draw() (watts float64, element, why string) {
	for _, r := range []struct{ name, v string }{
		{"power_draw", p.PowerDraw}, {"average_power_draw", p.AveragePowerDraw}, {"instant_power_draw", p.InstantPowerDraw},
	} {
		if w, ok := Float(r.v, "W"); ok {
			return w, r.name, ""
		}
	}
	return 0, "", "nvidia-smi gives no power draw (" + strings.Join(nonEmpty([]string{p.PowerDraw, p.AveragePowerDraw, p.InstantPowerDraw}), ", ") + ")"
}

// Clocks is <clocks> or <max_clocks> ("1980 MHz").
type Clocks struct {
	Graphics string `xml:"graphics_clock"`
	SM       string `xml:"sm_clock"`
	Mem      string `xml:"mem_clock"`
	Video    string `xml:"video_clock"`
}

// Parse reads `nvidia-smi -q -x` output.
func Parse(data []byte) (*Log, error) {
	var l Log
	// The DOCTYPE names an external DTD nvidia-smi does not ship; the
	// decoder skips it, and nothing in it is needed to read the elements.
	if err := xml.NewDecoder(bytes.NewReader(data)).Decode(&l); err != nil {
		return nil, fmt.Errorf("nvidia-smi XML: %w", err)
	}
	return &l, nil
}

// Marshal writes l as nvidia-smi does: the header, then the document
// indented with tabs.
func Marshal(l *Log) ([]byte, error) {
	b, err := xml.MarshalIndent(l, "", "\t")
	if err != nil {
		return nil, err
	}
	out := append([]byte(Header), b...)
	return append(out, '\n'), nil
}

// Uint reads a count ("0", "12"); false for N/A and anything else.
func Uint(s string) (uint64, bool) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	return n, err == nil
}

// Float reads a number with nvidia-smi's unit ("41 C", "259.00 W", "1980
// MHz", "81559 MiB", "16x"); false for N/A, another unit and anything else.
func Float(s, unit string) (float64, bool) {
	s = strings.TrimSpace(s)
	num, ok := strings.CutSuffix(s, unit)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	return f, err == nil
}

// Enabled reads "Enabled"/"Disabled" (and "Yes"/"No"); false when s is
// neither (N/A).
func Enabled(s string) (on, ok bool) {
	switch strings.TrimSpace(s) {
	case "Enabled", "Yes":
		return true, true
	case "Disabled", "No":
		return false, true
	}
	return false, false
}

// Missing is s, or "no element" when nvidia-smi wrote none: for saying
// why a value was not compared.
func Missing(s string) string {
	if strings.TrimSpace(s) == "" {
		return "no element"
	}
	return strings.TrimSpace(s)
}
