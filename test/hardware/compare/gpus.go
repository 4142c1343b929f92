package compare

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"

	"github.com/gpu-node-agent/gpu-node-agent/test/hardware/nvsmi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

const mib = 1 << 20

// Compare holds the agent's view in a capture against nvidia-smi's, value
// by value.
func Compare(in *Input) *Report {
	r := &Report{}
	gpus := censusGPUs(in.Census)
	list := parseList(in.SMIList)
	nodeChecks(r, in, gpus, list)
	for _, p := range pairGPUs(r, in, gpus, list) {
		p.identity()
		p.readings()
		p.errors()
		p.links()
		p.mig()
	}
	devicePlugin(r, in, gpus)
	draDevices(r, in, gpus)
	return r
}

// checker records findings about one subject.
type checker struct {
	r       *Report
	subject string
	// ref names the second side of values and numbers; "" is
	// nvidia-smi.
	ref string
}

func (c checker) refName() string {
	if c.ref == "" {
		return "nvidia-smi"
	}
	return c.ref
}

func (c checker) add(what string, o Outcome, detail string) {
	c.r.Findings = append(c.r.Findings, Finding{Subject: c.subject, What: what, Outcome: o, Detail: detail})
}

func (c checker) notCompared(what, why string) { c.add(what, NotCompared, why) }

// values compares two strings exactly; side names the agent's source
// ("census", "topology").
func (c checker) values(what, side string, a, s value) {
	switch {
	case a.why != "":
		c.notCompared(what, a.why)
	case s.why != "":
		c.notCompared(what, s.why)
	case a.v == s.v:
		c.add(what, Agree, fmt.Sprintf("%s %q, %s %q", side, a.v, c.refName(), s.v))
	default:
		c.add(what, Disagree, fmt.Sprintf("%s %q, %s %q", side, a.v, c.refName(), s.v))
	}
}

// numbers compares two numbers within tol.
func (c checker) numbers(what, side, unit string, a, s reading, tol Tolerance) {
	switch {
	case a.why != "":
		c.notCompared(what, a.why)
	case s.why != "":
		c.notCompared(what, s.why)
	default:
		o := Disagree
		if tol.OK(a.v, s.v) {
			o = Agree
		}
		c.add(what, o, fmt.Sprintf("%s %s, %s %s (%s)", side, formatNum(a.v, unit), c.refName(), formatNum(s.v, unit), tol.Name))
	}
}

func censusValue(v, why string) value         { return value{v: v, why: why} }
func censusNum(v float64, why string) reading { return reading{v: v, why: why} }

// topoValue is a topology string, "" being unknown.
func topoValue(v, what string) value {
	if v == "" {
		return value{why: "topology: no " + what}
	}
	return value{v: v}
}

func nodeChecks(r *Report, in *Input, gpus []*censusGPU, list []*listGPU) {
	c := checker{r: r, subject: "node"}
	x := in.SMI
	smiCount := smiReading(x.AttachedGPUs, "")
	if smiCount.why != "" && len(x.GPUs) > 0 {
		smiCount = reading{v: float64(len(x.GPUs))}
	}
	c.numbers("gpu_count", "census", "", censusNum(libNumber(in, "DeviceGetCount", float64(in.Census.DeviceCount))), smiCount, Exact)
	if in.Topology != nil {
		c.numbers("gpu_count", "topology", "", reading{v: float64(len(in.Topology.GPUs))}, smiCount, Exact)
	} else {
		c.notCompared("gpu_count (topology)", in.TopologyWhy)
	}
	if in.SMIListWhy == "" {
		c.numbers("gpu_count (-L)", "census", "", reading{v: float64(len(gpus))}, reading{v: float64(len(list))}, Exact)
	} else {
		c.notCompared("gpu_count (-L)", "nvidia-smi -L: "+in.SMIListWhy)
	}

	driver := censusValue(in.Census.DriverVersion, "")
	if driver.v == "" {
		driver.why = libWhy(in, "SystemGetDriverVersion")
	}
	c.values("driver_version", "census", driver, smiValue(x.DriverVersion))
	cuda := censusValue("", libWhy(in, "SystemGetCudaDriverVersion"))
	if in.Census.CUDADriverVersion > 0 {
		cuda = value{v: nvsmi.CUDAVersion(in.Census.CUDADriverVersion)}
	}
	c.values("cuda_version", "census", cuda, smiValue(x.CUDAVersion))
	if t := in.Topology; t != nil {
		c.values("driver_version", "topology", topoValue(t.Host.DriverVersion, "driver version"), smiValue(x.DriverVersion))
		tc := value{why: "topology: no CUDA version"}
		if t.Host.CUDADriverVersion > 0 {
			tc = value{v: nvsmi.CUDAVersion(t.Host.CUDADriverVersion)}
		}
		c.values("cuda_version", "topology", tc, smiValue(x.CUDAVersion))
	}
}

// libNumber is a library call's answer as the census summarised it, or
// why there is none.
func libNumber(in *Input, method string, v float64) (float64, string) {
	if why := libWhy(in, method); why != "" {
		return 0, why
	}
	return v, ""
}

// libWhy is why a library call has no answer; "" when it answered.
func libWhy(in *Input, method string) string {
	for _, c := range in.Census.Library {
		if c.Method == method {
			if c.Ret == "SUCCESS" {
				return ""
			}
			return "census: " + method + " answered " + c.Ret
		}
	}
	return "census: no " + method + " call"
}

// gpuPair is one GPU as the census, nvidia-smi's XML and -L, and the
// topology have it.
type gpuPair struct {
	checker
	in   *Input
	c    *censusGPU
	x    *nvsmi.GPU
	list *listGPU
	topo *topology.GPU
}

// pairGPUs pairs the census's GPUs with nvidia-smi's: by PCI bus ID (the
// XML's gpu id), then by UUID, then in order. A GPU only one side lists
// is a disagreement.
func pairGPUs(r *Report, in *Input, gpus []*censusGPU, list []*listGPU) []*gpuPair {
	xs := in.SMI.GPUs
	used := make([]bool, len(xs))
	pairs := make([]*gpuPair, len(gpus))
	match := func(key func(*censusGPU) string, xkey func(*nvsmi.GPU) string) {
		for i, g := range gpus {
			if pairs[i] != nil || key(g) == "" {
				continue
			}
			for j := range xs {
				if !used[j] && xkey(&xs[j]) == key(g) {
					pairs[i] = &gpuPair{x: &xs[j]}
					used[j] = true
					break
				}
			}
		}
	}
	match(func(g *censusGPU) string {
		b, _ := g.text("GetPciInfo", "busId")
		return normBus(b)
	}, func(x *nvsmi.GPU) string { return normBus(x.ID) })
	match(func(g *censusGPU) string { return g.UUID }, func(x *nvsmi.GPU) string { return x.UUID })
	for i := range gpus {
		for j := range xs {
			if pairs[i] == nil && !used[j] {
				pairs[i] = &gpuPair{x: &xs[j]}
				used[j] = true
			}
		}
	}
	node := checker{r: r, subject: "node"}
	var out []*gpuPair
	for i, g := range gpus {
		subject := "gpu " + strconv.Itoa(g.Index)
		if pairs[i] == nil {
			bus, _ := g.text("GetPciInfo", "busId")
			checker{r: r, subject: subject}.add("listed", Disagree, fmt.Sprintf("census has the GPU (%s, %s), nvidia-smi does not", g.UUID, bus))
			continue
		}
		p := pairs[i]
		p.checker, p.in, p.c = checker{r: r, subject: subject}, in, g
		for _, l := range list {
			if l.index == g.Index {
				p.list = l
			}
		}
		if in.Topology != nil {
			for k := range in.Topology.GPUs {
				if in.Topology.GPUs[k].Index == g.Index {
					p.topo = &in.Topology.GPUs[k]
				}
			}
		}
		out = append(out, p)
	}
	for j := range xs {
		if !used[j] {
			node.add("gpus", Disagree, fmt.Sprintf("nvidia-smi lists GPU %s (%s), the census does not", xs[j].ID, xs[j].UUID))
		}
	}
	return out
}

func normBus(s string) string {
	if s == "" {
		return ""
	}
	return topology.NormalizeBusID(s)
}

func (p *gpuPair) identity() {
	x := p.x
	p.values("uuid", "census", censusValue(p.c.UUID, ""), smiValue(x.UUID))
	bus, why := p.c.text("GetPciInfo", "busId")
	p.values("pci.bus_id", "census", censusValue(normBus(bus), why), value{v: normBus(x.ID), why: smiValue(x.ID).why})
	if p.list != nil {
		p.values("uuid (-L)", "census", censusValue(p.c.UUID, ""), smiValue(p.list.uuid))
	} else {
		p.notCompared("uuid (-L)", listWhy(p.in))
	}
	// The agent's NVML (nvmlapi) has no GetSerial: neither the census nor
	// the topology knows a serial.
	p.notCompared("serial", "the agent does not read the serial (nvmlapi has no GetSerial)")
	p.values("name", "census", censusValue(p.c.text("GetName", "")), smiValue(x.ProductName))
	minor, why := p.c.number("GetMinorNumber", "")
	p.numbers("minor_number", "census", "", censusNum(minor, why), smiReading(x.MinorNumber, ""), Exact)
	p.values("persistence_mode", "census", enableState(p.c.text("GetPersistenceMode", "")), smiState(x.PersistenceMode))
	if t := p.topo; t != nil {
		p.values("uuid", "topology", topoValue(t.UUID, "uuid"), smiValue(x.UUID))
		p.values("pci.bus_id", "topology", topoValue(normBus(t.PCIBusID), "bus id"), value{v: normBus(x.ID), why: smiValue(x.ID).why})
		p.values("name", "topology", topoValue(t.Model, "model"), smiValue(x.ProductName))
		brand := topoValue(t.Brand, "brand")
		if b, ok := topology.BrandType(t.Brand); ok {
			brand.v = nvsmi.BrandNames[b]
		}
		p.values("brand", "topology", brand, smiValue(x.ProductBrand))
		mem := reading{v: float64(t.MemoryMiB)}
		if t.MemoryMiB == 0 {
			mem.why = "topology: no memory size"
		}
		p.numbers("memory.total", "topology", "MiB", mem, smiReading(x.FBMemoryUsage.Total, "MiB"), Exact)
	} else {
		p.notCompared("topology", "agent/topology.json: "+p.in.TopologyWhy)
	}
}

func listWhy(in *Input) string {
	if in.SMIListWhy != "" {
		return "nvidia-smi -L: " + in.SMIListWhy
	}
	return "nvidia-smi -L does not list the GPU"
}

// enableState turns a census nvmlEnableState_t name into nvidia-smi's
// word.
func enableState(s, why string) value {
	switch {
	case why != "":
		return value{why: why}
	case s == "FEATURE_ENABLED":
		return value{v: "Enabled"}
	case s == "FEATURE_DISABLED":
		return value{v: "Disabled"}
	}
	return value{why: "census: enable state " + s}
}

// memoryMiB is the census's memory reading in MiB (nvidia-smi's R535+
// reading is GetMemoryInfo_v2; v1 where v2 was not answered).
func (d device) memoryMiB(field string) reading {
	v, why := d.number("GetMemoryInfo_v2", field)
	if why != "" {
		v1, why1 := d.number("GetMemoryInfo", field)
		if why1 != "" {
			return reading{why: why + "; " + why1}
		}
		v = v1
	}
	return reading{v: math.Floor(v / mib)}
}

func (p *gpuPair) readings() {
	x := p.x
	total := p.c.memoryMiB("total")
	p.numbers("memory.total", "census", "MiB", total, smiReading(x.FBMemoryUsage.Total, "MiB"), Exact)
	p.numbers("memory.used", "census", "MiB", p.c.memoryMiB("used"), smiReading(x.FBMemoryUsage.Used, "MiB"), MemoryUsed(total.v))

	t, why := p.c.number("GetTemperature", "", "TEMPERATURE_GPU")
	p.numbers("temperature.gpu", "census", "C", censusNum(t, why), smiReading(x.Temperature.GPU, "C"), Temperature)

	mw, why := p.c.number("GetPowerUsage", "")
	w, elem, smiWhy := x.Power.Draw()
	p.numbers("power.draw", "census", "W", censusNum(mw/1000, why), reading{v: w, why: smiWhy}, withName(Power, elem))

	for _, ck := range []struct{ what, arg, smi string }{
		{"clocks.graphics", "CLOCK_GRAPHICS", x.Clocks.Graphics},
		{"clocks.sm", "CLOCK_SM", x.Clocks.SM},
		{"clocks.mem", "CLOCK_MEM", x.Clocks.Mem},
		{"clocks.video", "CLOCK_VIDEO", x.Clocks.Video},
	} {
		v, why := p.c.number("GetClockInfo", "", ck.arg)
		p.numbers(ck.what, "census", "MHz", censusNum(v, why), smiReading(ck.smi, "MHz"), Clock)
	}
	// nvmlapi has no GetMaxClockInfo.
	p.notCompared("max_clocks", "the agent does not read the maximum clocks (nvmlapi has no GetMaxClockInfo)")

	l := x.PCI.Link
	maxGen, why := p.c.number("GetMaxPcieLinkGeneration", "")
	smiMax := smiReading(l.MaxGen, "")
	p.numbers("pcie.gen.max", "census", "", censusNum(maxGen, why), smiMax, Exact)
	curGen, why := p.c.number("GetCurrPcieLinkGeneration", "")
	if smiMax.why == "" && smiMax.v > maxGen {
		maxGen = smiMax.v
	}
	p.numbers("pcie.gen.current", "census", "", censusNum(curGen, why), smiReading(l.CurrentGen, ""), LinkGeneration(maxGen))
	v, why := p.c.number("GetMaxPcieLinkWidth", "")
	p.numbers("pcie.width.max", "census", "x", censusNum(v, why), smiReading(l.MaxWidth, "x"), Exact)
	v, why = p.c.number("GetCurrPcieLinkWidth", "")
	p.numbers("pcie.width.current", "census", "x", censusNum(v, why), smiReading(l.CurrentWidth, "x"), Exact)
	v, why = p.c.number("GetPcieReplayCounter", "")
	p.numbers("pcie.replay_counter", "census", "", censusNum(v, why), smiReading(x.PCI.ReplayCounter, ""), Grows)
}

// withName names the nvidia-smi element a tolerance was applied to.
func withName(t Tolerance, element string) Tolerance {
	if element != "" {
		t.Name = element + ", " + t.Name
	}
	return t
}

func (p *gpuPair) errors() {
	x := p.x
	p.values("ecc.mode.current", "census", enableState(p.c.text("GetEccMode", "current")), smiState(x.ECCMode.Current))
	p.values("ecc.mode.pending", "census", enableState(p.c.text("GetEccMode", "pending")), smiState(x.ECCMode.Pending))
	for _, e := range []struct {
		what, typ, counter string
		counts             nvsmi.ECCCounts
	}{
		{"ecc.volatile", "", "VOLATILE_ECC", x.ECCErrors.Volatile},
		{"ecc.aggregate", "", "AGGREGATE_ECC", x.ECCErrors.Aggregate},
	} {
		v, why := p.c.number("GetTotalEccErrors", "", "MEMORY_ERROR_TYPE_CORRECTED", e.counter)
		n, smiWhy := e.counts.Corrected()
		p.numbers(e.what+".corrected", "census", "", censusNum(v, why), smiCount(n, smiWhy), Grows)
		v, why = p.c.number("GetTotalEccErrors", "", "MEMORY_ERROR_TYPE_UNCORRECTED", e.counter)
		n, smiWhy = e.counts.Uncorrected()
		p.numbers(e.what+".uncorrected", "census", "", censusNum(v, why), smiCount(n, smiWhy), Grows)
	}
	v, why := p.c.count("GetRetiredPages", "PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS")
	p.numbers("retired_pages.multiple_single_bit", "census", "", censusNum(v, why), smiReading(x.RetiredPages.MultipleSingleBit.Count, ""), Grows)
	v, why = p.c.count("GetRetiredPages", "PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR")
	p.numbers("retired_pages.double_bit", "census", "", censusNum(v, why), smiReading(x.RetiredPages.DoubleBit.Count, ""), Grows)
	pending := enableState(p.c.text("GetRetiredPagesPendingStatus", ""))
	if pending.why == "" {
		pending.v = yesNo(pending.v == state(true))
	}
	p.values("retired_pages.pending", "census", pending, smiState(x.RetiredPages.Pending))

	v, why = p.c.number("GetRemappedRows", "corrRows")
	p.numbers("remapped_rows.correctable", "census", "", censusNum(v, why), smiReading(x.RemappedRows.Corr, ""), Grows)
	v, why = p.c.number("GetRemappedRows", "uncRows")
	p.numbers("remapped_rows.uncorrectable", "census", "", censusNum(v, why), smiReading(x.RemappedRows.Unc, ""), Grows)
	p.values("remapped_rows.pending", "census", boolState(p.c.text("GetRemappedRows", "isPending")), smiState(x.RemappedRows.Pending))
	p.values("remapped_rows.failure", "census", boolState(p.c.text("GetRemappedRows", "failureOccurred")), smiState(x.RemappedRows.Failure))
}

func smiCount(n uint64, why string) reading {
	if why != "" {
		return reading{why: why}
	}
	return reading{v: float64(n)}
}

// boolState turns a census true/false into nvidia-smi's Yes/No.
func boolState(s, why string) value {
	switch {
	case why != "":
		return value{why: why}
	case s == "true":
		return value{v: yesNo(true)}
	case s == "false":
		return value{v: yesNo(false)}
	}
	return value{why: "census: " + s}
}

// links compares the GPU's active NVLinks: `nvidia-smi -q -x` lists none
// (R555 and R575 print only the fabric state), so `nvidia-smi nvlink -s`
// is the reference.
func (p *gpuPair) links() {
	var active []int
	answered, why := false, "census: no GetNvLinkState call"
	for _, c := range p.c.Calls {
		if c.Method != "GetNvLinkState" || len(c.Args) != 1 {
			continue
		}
		if c.Ret != "SUCCESS" {
			if !answered {
				why = fmt.Sprintf("census: GetNvLinkState(%v) answered %s", c.Args[0], c.Ret)
			}
			continue
		}
		answered = true
		if l, ok := toFloat(c.Args[0]); ok && c.Value == "FEATURE_ENABLED" {
			active = append(active, int(l))
		}
	}
	if p.in.NVLinkStatusWhy != "" {
		p.notCompared("nvlink.active", "nvidia-smi -q -x lists no NVLinks and nvidia-smi nvlink -s is "+p.in.NVLinkStatusWhy)
		return
	}
	var smi *nvlinkGPU
	for _, g := range parseNVLinkStatus(p.in.NVLinkStatus) {
		if g.uuid != "" && g.uuid == p.c.UUID || g.uuid == "" && g.index == p.c.Index {
			smi = g
		}
	}
	switch {
	case !answered:
		p.notCompared("nvlink.active", why)
	case smi == nil:
		p.notCompared("nvlink.active", "nvidia-smi nvlink -s does not list the GPU")
	default:
		p.values("nvlink.active", "census", value{v: linkSet(active)}, value{v: linkSet(smi.active)})
	}
}

// mig compares the MIG mode and the MIG devices: instance IDs and memory
// from the XML, UUIDs from -L.
func (p *gpuPair) mig() {
	x := p.x
	cur, why := p.c.number("GetMigMode", "currentMode")
	p.values("mig.mode.current", "census", migState(cur, why), smiState(x.MIGMode.Current))
	pend, why := p.c.number("GetMigMode", "pendingMode")
	p.values("mig.mode.pending", "census", migState(pend, why), smiState(x.MIGMode.Pending))
	smiMIGs := map[int]*nvsmi.MIGDevice{}
	for i := range x.MIGDevices.Devices {
		m := &x.MIGDevices.Devices[i]
		if n, ok := nvsmi.Uint(m.Index); ok {
			smiMIGs[int(n)] = m
		}
	}
	if len(p.c.migs) == 0 && len(smiMIGs) == 0 {
		return
	}
	p.numbers("mig.devices", "census", "", reading{v: float64(len(p.c.migs))}, reading{v: float64(len(x.MIGDevices.Devices))}, Exact)
	seen := map[int]bool{}
	for _, m := range p.c.migs {
		seen[m.Index] = true
		c := checker{r: p.r, subject: fmt.Sprintf("%s mig %d", p.subject, m.Index)}
		xm := smiMIGs[m.Index]
		if xm == nil {
			c.add("listed", Disagree, fmt.Sprintf("census has MIG device %d (%s), nvidia-smi does not", m.Index, m.UUID))
			continue
		}
		c.numbers("gpu_instance_id", "census", "", intPtr(m.GPUInstance, "GetGpuInstanceId"), smiReading(xm.GPUInstanceID, ""), Exact)
		c.numbers("compute_instance_id", "census", "", intPtr(m.ComputeInstance, "GetComputeInstanceId"), smiReading(xm.ComputeInstanceID, ""), Exact)
		c.numbers("memory.total", "census", "MiB", m.memoryMiB("total"), smiReading(xm.FBMemoryUsage.Total, "MiB"), Exact)
		listUUID := value{why: listWhy(p.in)}
		if p.list != nil {
			if u, ok := p.list.migs[m.Index]; ok {
				listUUID = value{v: u}
			} else if p.in.SMIListWhy == "" {
				listUUID.why = "nvidia-smi -L does not list the MIG device"
			}
		}
		c.values("uuid (-L)", "census", censusValue(m.UUID, ""), listUUID)
		if p.topo != nil {
			var tm *topology.MIGDevice
			for k := range p.topo.MIG {
				if p.topo.MIG[k].Index == m.Index {
					tm = &p.topo.MIG[k]
				}
			}
			if tm == nil {
				c.add("listed (topology)", Disagree, fmt.Sprintf("census has MIG device %d (%s), the topology does not", m.Index, m.UUID))
				continue
			}
			c.values("uuid (-L)", "topology", topoValue(tm.UUID, "uuid"), listUUID)
			c.numbers("gpu_instance_id", "topology", "", reading{v: float64(tm.GPUInstance)}, smiReading(xm.GPUInstanceID, ""), Exact)
			c.numbers("compute_instance_id", "topology", "", reading{v: float64(tm.ComputeInstance)}, smiReading(xm.ComputeInstanceID, ""), Exact)
		}
	}
	for _, i := range slices.Sorted(maps.Keys(smiMIGs)) {
		if xm := smiMIGs[i]; !seen[i] {
			checker{r: p.r, subject: fmt.Sprintf("%s mig %d", p.subject, i)}.add("listed", Disagree,
				fmt.Sprintf("nvidia-smi lists MIG device %d (GI %s, CI %s), the census does not", i, xm.GPUInstanceID, xm.ComputeInstanceID))
		}
	}
}

func migState(v float64, why string) value {
	if why != "" {
		return value{why: why}
	}
	return value{v: state(v == 1)}
}

func intPtr(p *int, method string) reading {
	if p == nil {
		return reading{why: "census: " + method + " not answered"}
	}
	return reading{v: float64(*p)}
}
