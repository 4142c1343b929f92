package nvmlapi_test

import (
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

var (
	libraryType  = reflect.TypeFor[nvmlapi.Library]()
	deviceType   = reflect.TypeFor[nvmlapi.Device]()
	eventSetType = reflect.TypeFor[nvmlapi.EventSet]()
	giType       = reflect.TypeFor[nvmlapi.GpuInstance]()
	ciType       = reflect.TypeFor[nvmlapi.ComputeInstance]()
	returnType   = reflect.TypeFor[nvml.Return]()
)

// goNVML maps a narrow type to go-nvml's.
func goNVML(t reflect.Type) reflect.Type {
	switch t {
	case libraryType:
		return reflect.TypeFor[nvml.Interface]()
	case deviceType:
		return reflect.TypeFor[nvml.Device]()
	case eventSetType:
		return reflect.TypeFor[nvml.EventSet]()
	case giType:
		return reflect.TypeFor[nvml.GpuInstance]()
	case ciType:
		return reflect.TypeFor[nvml.ComputeInstance]()
	case reflect.TypeFor[nvmlapi.EventData]():
		return reflect.TypeFor[nvml.EventData]()
	case reflect.TypeFor[nvmlapi.ComputeInstanceInfo]():
		return reflect.TypeFor[nvml.ComputeInstanceInfo]()
	}
	if t.Kind() == reflect.Slice {
		if e := goNVML(t.Elem()); e != t.Elem() {
			return reflect.SliceOf(e)
		}
	}
	return t
}

// TestSignaturesMirrorGoNVML: every method is go-nvml's method of the same
// name with the same signature, handles aside, so the real binding is a
// plain forward and the count is what the agent calls.
func TestSignaturesMirrorGoNVML(t *testing.T) {
	total := 0
	for _, narrow := range []reflect.Type{libraryType, deviceType, eventSetType, giType, ciType} {
		wide := goNVML(narrow)
		for i := range narrow.NumMethod() {
			total++
			m := narrow.Method(i)
			w, ok := wide.MethodByName(m.Name)
			if !ok {
				t.Errorf("%s.%s: not a method of %s", narrow.Name(), m.Name, wide)
				continue
			}
			same := m.Type.NumIn() == w.Type.NumIn() && m.Type.NumOut() == w.Type.NumOut()
			for k := 0; same && k < m.Type.NumIn(); k++ {
				same = goNVML(m.Type.In(k)) == w.Type.In(k)
			}
			for k := 0; same && k < m.Type.NumOut(); k++ {
				same = goNVML(m.Type.Out(k)) == w.Type.Out(k)
			}
			if !same {
				t.Errorf("%s.%s is %s; go-nvml's is %s", narrow.Name(), m.Name, m.Type, w.Type)
			}
		}
	}
	if total != 69 {
		t.Errorf("%d methods, want 69 (update the package doc and this count together)", total)
	}
}

// theExtensions is what a fake Extensions call answers.
var theExtensions = &mock.ExtendedInterface{}

// The GPU and compute instances the fake calls answer, told apart from
// others by their info's ID.
var (
	peerGI = &mock.GpuInstance{GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) {
		return nvml.GpuInstanceInfo{Id: 42}, nvml.SUCCESS
	}}
	peerCI = &mock.ComputeInstance{GetInfoFunc: func() (nvml.ComputeInstanceInfo, nvml.Return) {
		return nvml.ComputeInstanceInfo{Id: 43}, nvml.SUCCESS
	}}
)

// fakeCall makes a mock function of type ft that records its arguments and
// answers zero values, handle (or peerGI, peerCI), and ret.
func fakeCall(ft reflect.Type, handle nvml.Device, ret nvml.Return, got *[]reflect.Value) reflect.Value {
	return reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
		*got = args
		out := make([]reflect.Value, ft.NumOut())
		for k := range out {
			switch ft.Out(k) {
			case returnType:
				out[k] = reflect.ValueOf(ret)
			case reflect.TypeFor[nvml.Device]():
				out[k] = reflect.ValueOf(&handle).Elem()
			case reflect.TypeFor[nvml.GpuInstance]():
				gi := nvml.GpuInstance(peerGI)
				out[k] = reflect.ValueOf(&gi).Elem()
			case reflect.TypeFor[[]nvml.GpuInstance]():
				out[k] = reflect.ValueOf([]nvml.GpuInstance{peerGI})
			case reflect.TypeFor[nvml.ComputeInstance]():
				ci := nvml.ComputeInstance(peerCI)
				out[k] = reflect.ValueOf(&ci).Elem()
			case reflect.TypeFor[nvml.ComputeInstanceInfo]():
				out[k] = reflect.ValueOf(nvml.ComputeInstanceInfo{Device: handle, GpuInstance: peerGI, Id: 7, ProfileId: 8,
					Placement: nvml.ComputeInstancePlacement{Start: 1, Size: 2}})
			case reflect.TypeFor[nvml.ExtendedInterface]():
				var ext nvml.ExtendedInterface = theExtensions
				out[k] = reflect.ValueOf(&ext).Elem()
			default:
				out[k] = reflect.Zero(ft.Out(k))
			}
		}
		return out
	})
}

// isPeerGI says whether gi is peerGI wrapped (its info's ID is 42).
func isPeerGI(gi nvmlapi.GpuInstance) bool {
	if gi == nil {
		return false
	}
	info, ret := gi.GetInfo()
	return ret == nvml.SUCCESS && info.Id == 42
}

// isPeerCI says whether ci is peerCI wrapped (its info's ID is 43).
func isPeerCI(ci nvmlapi.ComputeInstance) bool {
	if ci == nil {
		return false
	}
	info, ret := ci.GetInfo()
	return ret == nvml.SUCCESS && info.Id == 43
}

// TestWrapForwardsEveryCall: every Library, Device, GpuInstance and
// ComputeInstance method called through Wrap, over go-nvml's own mocks,
// calls the mock's function of the same name once, with the caller's
// arguments (handles and sets unwrapped), and hands back its answer
// (handles wrapped).
func TestWrapForwardsEveryCall(t *testing.T) {
	const ret = nvml.ERROR_IN_USE // an answer nothing else gives
	dev, peer := &mock.Device{}, &mock.Device{}
	mset := &mock.EventSet{}
	mgi, mci := &mock.GpuInstance{}, &mock.ComputeInstance{}
	dev.GetGpuInstanceByIdFunc = func(int) (nvml.GpuInstance, nvml.Return) { return mgi, nvml.SUCCESS }
	mgi.GetComputeInstanceByIdFunc = func(int) (nvml.ComputeInstance, nvml.Return) { return mci, nvml.SUCCESS }
	mlib := &mock.Interface{
		DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS },
		EventSetCreateFunc:         func() (nvml.EventSet, nvml.Return) { return mset, nvml.SUCCESS },
	}
	lib := nvmlapi.Wrap(mlib)
	d, _ := lib.DeviceGetHandleByIndex(0)
	set, _ := lib.EventSetCreate()
	gi, _ := d.GetGpuInstanceById(1)
	ci, _ := gi.GetComputeInstanceById(0)
	// The arguments each call is made with, and what the mock must see.
	arg := func(pt reflect.Type) (given, want reflect.Value) {
		switch pt {
		case deviceType:
			w := nvmlapi.WrapDevice(peer)
			return reflect.ValueOf(&w).Elem(), reflect.ValueOf(nvml.Device(peer))
		case eventSetType:
			return reflect.ValueOf(&set).Elem(), reflect.ValueOf(nvml.EventSet(mset))
		}
		v := reflect.New(pt).Elem()
		switch v.Kind() {
		case reflect.Int, reflect.Int32:
			v.SetInt(7)
		case reflect.Uint32, reflect.Uint64:
			v.SetUint(7)
		case reflect.String:
			v.SetString("GPU-7")
		case reflect.Slice:
			v.Set(reflect.MakeSlice(pt, 1, 1))
		case reflect.Pointer:
			v.Set(reflect.New(pt.Elem()))
		}
		return v, v
	}
	for _, target := range []struct {
		iface reflect.Type
		recv  any // the adapter
		mock  any // pointer to the mock whose XxxFunc fields answer
	}{
		{deviceType, d, dev},
		{libraryType, lib, mlib},
		{giType, gi, mgi},
		{ciType, ci, mci},
	} {
		for i := range target.iface.NumMethod() {
			m := target.iface.Method(i)
			t.Run(target.iface.Name()+"."+m.Name, func(t *testing.T) {
				field := reflect.ValueOf(target.mock).Elem().FieldByName(m.Name + "Func")
				if !field.IsValid() {
					t.Fatalf("go-nvml's mock has no %sFunc", m.Name)
				}
				saved := reflect.ValueOf(field.Interface())
				defer field.Set(saved)
				var got []reflect.Value
				field.Set(fakeCall(field.Type(), peer, ret, &got))
				var given, want []reflect.Value
				for k := range m.Type.NumIn() {
					g, w := arg(m.Type.In(k))
					given, want = append(given, g), append(want, w)
				}
				out := reflect.ValueOf(target.recv).MethodByName(m.Name).Call(given)
				if len(got) != len(want) {
					t.Fatalf("mock called with %d arguments, want %d (or not called)", len(got), len(want))
				}
				for k := range want {
					if !reflect.DeepEqual(got[k].Interface(), want[k].Interface()) {
						t.Errorf("argument %d: mock got %v, want %v", k, got[k], want[k])
					}
				}
				switch last := out[len(out)-1]; last.Type() {
				case returnType:
					if r := last.Interface(); r != ret {
						t.Errorf("returned %v, want the mock's %v", r, ret)
					}
				case reflect.TypeFor[nvml.ExtendedInterface]():
					if last.Interface() != nvml.ExtendedInterface(theExtensions) {
						t.Errorf("returned %v, want the mock's extensions", last)
					}
				default:
					t.Errorf("answers %s: teach this test to check it", last.Type())
				}
				for _, o := range out {
					switch o.Type() {
					case deviceType:
						if o.Interface() != nvmlapi.WrapDevice(peer) {
							t.Errorf("handle %v, want the mock's device wrapped", o)
						}
					case giType:
						if g, _ := o.Interface().(nvmlapi.GpuInstance); !isPeerGI(g) {
							t.Errorf("gpu instance %v, want the mock's wrapped", o)
						}
					case reflect.TypeFor[[]nvmlapi.GpuInstance]():
						gis, _ := o.Interface().([]nvmlapi.GpuInstance)
						if len(gis) != 1 || !isPeerGI(gis[0]) {
							t.Errorf("gpu instances %v, want the mock's one wrapped", o)
						}
					case ciType:
						if c, _ := o.Interface().(nvmlapi.ComputeInstance); !isPeerCI(c) {
							t.Errorf("compute instance %v, want the mock's wrapped", o)
						}
					case reflect.TypeFor[nvmlapi.ComputeInstanceInfo]():
						info, _ := o.Interface().(nvmlapi.ComputeInstanceInfo)
						if info.Device != nvmlapi.WrapDevice(peer) || !isPeerGI(info.GpuInstance) || info.Id != 7 || info.ProfileId != 8 ||
							info.Placement != (nvml.ComputeInstancePlacement{Start: 1, Size: 2}) {
							t.Errorf("compute instance info %+v, want the mock's with its handles wrapped", info)
						}
					}
				}
			})
		}
	}
}

func TestWrapHandles(t *testing.T) {
	gpu, other := &mock.Device{}, &mock.Device{}
	mset := &mock.EventSet{}
	var events []nvml.EventData
	mset.WaitFunc = func(uint32) (nvml.EventData, nvml.Return) {
		e := events[0]
		events = events[1:]
		return e, nvml.SUCCESS
	}
	mlib := &mock.Interface{
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i != 0 {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return gpu, nvml.SUCCESS
		},
		DeviceGetHandleByUUIDFunc: func(string) (nvml.Device, nvml.Return) { return gpu, nvml.SUCCESS },
		EventSetCreateFunc:        func() (nvml.EventSet, nvml.Return) { return mset, nvml.SUCCESS },
	}
	gpu.GetTopologyCommonAncestorFunc = func(d nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		if d != other {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.TOPOLOGY_NODE, nvml.SUCCESS
	}
	gpu.RegisterEventsFunc = func(_ uint64, s nvml.EventSet) nvml.Return {
		if s != mset {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.SUCCESS
	}
	migDev := &mock.Device{}
	gpu.GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return migDev, nvml.SUCCESS }
	theGI := &mock.GpuInstance{GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) {
		return nvml.GpuInstanceInfo{Device: gpu, Id: 1}, nvml.SUCCESS
	}}
	theGI.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		switch id {
		case 0:
			return &mock.ComputeInstance{GetInfoFunc: func() (nvml.ComputeInstanceInfo, nvml.Return) {
				return nvml.ComputeInstanceInfo{Device: migDev, GpuInstance: theGI}, nvml.SUCCESS
			}}, nvml.SUCCESS
		case 1:
			return &mock.ComputeInstance{GetInfoFunc: func() (nvml.ComputeInstanceInfo, nvml.Return) {
				return nvml.ComputeInstanceInfo{Id: 1}, nvml.SUCCESS
			}}, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	gpu.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		if id != 1 {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return theGI, nvml.SUCCESS
	}
	lib := nvmlapi.Wrap(mlib)
	byIndex, _ := lib.DeviceGetHandleByIndex(0)
	set, _ := lib.EventSetCreate()

	tests := []struct {
		name string
		ok   func() bool
	}{
		{"handles of one device compare equal", func() bool {
			byUUID, _ := lib.DeviceGetHandleByUUID("GPU-0")
			return byIndex == byUUID && byIndex == nvmlapi.WrapDevice(gpu)
		}},
		{"a failed lookup's handle is nil", func() bool {
			d, ret := lib.DeviceGetHandleByIndex(1)
			return d == nil && ret == nvml.ERROR_INVALID_ARGUMENT
		}},
		{"WrapDevice(nil) is nil", func() bool { return nvmlapi.WrapDevice(nil) == nil }},
		{"a missing GPU instance is nil", func() bool {
			gi, ret := byIndex.GetGpuInstanceById(2)
			return gi == nil && ret == nvml.ERROR_NOT_FOUND
		}},
		{"handles of one GPU instance compare equal", func() bool {
			a, _ := byIndex.GetGpuInstanceById(1)
			b, ret := byIndex.GetGpuInstanceById(1)
			return a != nil && a == b && ret == nvml.SUCCESS
		}},
		{"a GPU instance is go-nvml's, wrapped", func() bool {
			gi, ret := byIndex.GetGpuInstanceById(1)
			info, _ := gi.GetInfo()
			return ret == nvml.SUCCESS && info.Id == 1
		}},
		{"a missing compute instance is nil", func() bool {
			gi, _ := byIndex.GetGpuInstanceById(1)
			ci, ret := gi.GetComputeInstanceById(3)
			return ci == nil && ret == nvml.ERROR_NOT_FOUND
		}},
		{"a compute instance's MIG device compares equal to its handle", func() bool {
			gi, _ := byIndex.GetGpuInstanceById(1)
			ci, ret := gi.GetComputeInstanceById(0)
			if ret != nvml.SUCCESS {
				return false
			}
			info, ret := ci.GetInfo()
			m, _ := byIndex.GetMigDeviceHandleByIndex(0)
			return ret == nvml.SUCCESS && info.Device == m && info.Device != nil
		}},
		{"a compute instance without a device has a nil Device", func() bool {
			gi, _ := byIndex.GetGpuInstanceById(1)
			ci, _ := gi.GetComputeInstanceById(1)
			info, ret := ci.GetInfo()
			return ret == nvml.SUCCESS && info.Device == nil && info.GpuInstance == nil
		}},
		{"GetTopologyCommonAncestor unwraps the other handle", func() bool {
			lvl, ret := byIndex.GetTopologyCommonAncestor(nvmlapi.WrapDevice(other))
			return lvl == nvml.TOPOLOGY_NODE && ret == nvml.SUCCESS
		}},
		{"GetTopologyCommonAncestor refuses a foreign handle", func() bool {
			_, ret := byIndex.GetTopologyCommonAncestor(nil)
			return ret == nvml.ERROR_INVALID_ARGUMENT
		}},
		{"RegisterEvents unwraps the set", func() bool {
			return byIndex.RegisterEvents(nvml.EventTypeXidCriticalError, set) == nvml.SUCCESS
		}},
		{"RegisterEvents refuses a foreign set", func() bool {
			return byIndex.RegisterEvents(nvml.EventTypeXidCriticalError, nil) == nvml.ERROR_INVALID_ARGUMENT
		}},
		{"Wait wraps the event's device and keeps the rest", func() bool {
			events = append(events, nvml.EventData{Device: gpu, EventType: nvml.EventTypeXidCriticalError, EventData: 79,
				GpuInstanceId: 1, ComputeInstanceId: 2})
			e, ret := set.Wait(10)
			return ret == nvml.SUCCESS && e == nvmlapi.EventData{Device: byIndex, EventType: nvml.EventTypeXidCriticalError,
				EventData: 79, GpuInstanceId: 1, ComputeInstanceId: 2}
		}},
		{"an event without a device has a nil Device", func() bool {
			events = append(events, nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 13})
			e, ret := set.Wait(10)
			return ret == nvml.SUCCESS && e.Device == nil && e.EventData == 13
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.ok() {
				t.Fail()
			}
		})
	}
}
