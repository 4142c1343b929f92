package main

import (
	"bytes"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
)

func getenvOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// TestSharingConfig: the sharing section of the agent's config file, and
// NVIDIA's config file given with --nvidia-config (or GNA_NVIDIA_CONFIG,
// or the nvidia-config key), between the agent's file and env/flags.
func TestSharingConfig(t *testing.T) {
	nvidiaTS := &gpu.TimeSlicing{RenameByDefault: true, Resources: []gpu.SharedResource{{Name: gpu.ResourceGPU, Replicas: 4}}}
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(t *testing.T, c Config)
	}{
		{name: "the agent's own section", args: []string{"--config", "testdata/sharing.yaml"}, check: func(t *testing.T, c Config) {
			want := &gpu.TimeSlicing{FailRequestsGreaterThanOne: true, Resources: []gpu.SharedResource{
				{Name: gpu.ResourceGPU, Replicas: 4, Rename: "nvidia.com/gpu-small", Devices: gpu.SharedDevices{List: []string{"0", "1"}}},
				{Name: "nvidia.com/mig-1g.10gb", Replicas: 2},
			}}
			if !reflect.DeepEqual(c.Sharing.TimeSlicing, want) {
				t.Errorf("sharing = %+v, want %+v", c.Sharing.TimeSlicing, want)
			}
			if got := c.agentConfig("/").GPU.TimeSlicing; got != c.Sharing.TimeSlicing {
				t.Errorf("the agent is not given the section: %+v", got)
			}
		}},
		{name: "no sharing by default", check: func(t *testing.T, c Config) {
			if c.Sharing.TimeSlicing != nil || c.agentConfig("/").GPU.TimeSlicing != nil {
				t.Errorf("sharing = %+v", c.Sharing.TimeSlicing)
			}
		}},
		{name: "NVIDIA's file by flag", args: []string{"--nvidia-config", "testdata/nvidia-config.yaml"}, check: func(t *testing.T, c Config) {
			if c.MIGStrategy != "mixed" || !c.PassDeviceSpecs || c.DeviceListStrategy != "volume-mounts" {
				t.Errorf("flags not taken: mig %q pass %v list %q", c.MIGStrategy, c.PassDeviceSpecs, c.DeviceListStrategy)
			}
			// devices: [0] is dropped, as NVIDIA's plugin drops it.
			if !reflect.DeepEqual(c.Sharing.TimeSlicing, nvidiaTS) {
				t.Errorf("sharing = %+v, want %+v", c.Sharing.TimeSlicing, nvidiaTS)
			}
			if len(c.nvidiaIgnored) != 2 {
				t.Errorf("ignored = %q, want failOnInitError and devices", c.nvidiaIgnored)
			}
		}},
		{name: "NVIDIA's file by env", env: map[string]string{"GNA_NVIDIA_CONFIG": "testdata/nvidia-config.yaml"}, check: func(t *testing.T, c Config) {
			if !reflect.DeepEqual(c.Sharing.TimeSlicing, nvidiaTS) || c.NVIDIAConfig != "testdata/nvidia-config.yaml" {
				t.Errorf("sharing = %+v from %q", c.Sharing.TimeSlicing, c.NVIDIAConfig)
			}
		}},
		{name: "NVIDIA's file named in the agent's", args: []string{"--config", "testdata/with-nvidia-config.yaml"}, check: func(t *testing.T, c Config) {
			if !reflect.DeepEqual(c.Sharing.TimeSlicing, nvidiaTS) || c.LogLevel != "debug" {
				t.Errorf("sharing = %+v, log level %q", c.Sharing.TimeSlicing, c.LogLevel)
			}
		}},
		{name: "the agent's file agreeing with NVIDIA's", args: []string{"--config", "testdata/config.yaml", "--nvidia-config", "testdata/nvidia-agrees.yaml"},
			check: func(t *testing.T, c Config) {
				if c.MIGStrategy != "mixed" || c.DeviceListStrategy != "cdi-cri" || !c.PassDeviceSpecs || c.Sharing.TimeSlicing != nil {
					t.Errorf("mig %q list %q pass %v sharing %v", c.MIGStrategy, c.DeviceListStrategy, c.PassDeviceSpecs, c.Sharing.TimeSlicing)
				}
			}},
		{name: "env and flags over NVIDIA's file", args: []string{"--nvidia-config", "testdata/nvidia-config.yaml", "--mig-strategy", "single"},
			env: map[string]string{"GNA_DEVICE_LIST_STRATEGY": "cdi-cri"}, check: func(t *testing.T, c Config) {
				if c.MIGStrategy != "single" || c.DeviceListStrategy != "cdi-cri" || !c.PassDeviceSpecs {
					t.Errorf("mig %q list %q pass %v; want single (flag), cdi-cri (env), true (NVIDIA's file)", c.MIGStrategy, c.DeviceListStrategy, c.PassDeviceSpecs)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, getenvOf(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestSharingConfigErrors(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "MPS in the agent's file", args: []string{"--config", "testdata/sharing-mps.yaml"}, wantErr: "sharing.mps: MPS is not supported"},
		{name: "unknown key in the section", args: []string{"--config", "testdata/sharing-unknown-key.yaml"}, wantErr: "unknown field sharing.timeSlicing.resources[0].renames"},
		{name: "NVIDIA's file missing", args: []string{"--nvidia-config", "testdata/nope.yaml"}, wantErr: "nvidia-config: open testdata/nope.yaml: no such file"},
		{name: "NVIDIA's file contradicting the agent's", args: []string{"--config", "testdata/config.yaml", "--nvidia-config", "testdata/nvidia-none.yaml"},
			wantErr: "nvidia-config testdata/nvidia-none.yaml: flags.migStrategy is none, but mig-strategy in testdata/config.yaml is mixed; set it in one file"},
		{name: "a contradicted device-list strategy", args: []string{"--config", "testdata/config.yaml", "--nvidia-config", "testdata/nvidia-config.yaml"},
			wantErr: "nvidia-config testdata/nvidia-config.yaml: flags.plugin.deviceListStrategy is volume-mounts, but device-list-strategy in testdata/config.yaml is cdi-cri; set it in one file"},
		{name: "sharing in both files", args: []string{"--config", "testdata/sharing.yaml", "--nvidia-config", "testdata/nvidia-config.yaml"},
			wantErr: "sharing.timeSlicing is also set in testdata/sharing.yaml; set it in one file"},
		{name: "NVIDIA's file with MPS", args: []string{"--nvidia-config", "testdata/sharing-mps.yaml"}, wantErr: "nvidia-config testdata/sharing-mps.yaml: sharing.mps: MPS is not supported"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(tc.args, getenvOf(nil), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestSharingConfigValidate(t *testing.T) {
	ts := func(name string) *gpu.TimeSlicing {
		return &gpu.TimeSlicing{Resources: []gpu.SharedResource{{Name: name, Replicas: 2}}}
	}
	tests := []struct {
		name    string
		mutate  func(c *Config)
		wantErr string
	}{
		{name: "GPUs shared", mutate: func(c *Config) { c.Sharing.TimeSlicing = ts(gpu.ResourceGPU) }},
		{name: "a bad section names its key", mutate: func(c *Config) {
			c.Sharing.TimeSlicing = &gpu.TimeSlicing{Resources: []gpu.SharedResource{{Name: gpu.ResourceGPU, Replicas: 1}}}
		}, wantErr: "sharing.timeSlicing.resources[0].replicas: 1 is not between 2 and 1024"},
		{name: "MIG shared outside mixed", mutate: func(c *Config) { c.Sharing.TimeSlicing = ts("nvidia.com/mig-1g.10gb") },
			wantErr: "sharing.timeSlicing.resources[0].name: nvidia.com/mig-1g.10gb is served only under mig-strategy mixed"},
		{name: "GPUs shared while DRA serves them", mutate: func(c *Config) {
			c.NodeName = "node-a"
			c.DRA.Kinds = []string{"gpu", "mig"}
			c.Sharing.TimeSlicing = ts(gpu.ResourceGPU)
		}, wantErr: "sharing.timeSlicing.resources[0].name: nvidia.com/gpu cannot be shared: dra.devices serves gpu devices through DRA, which shares them only with dra.sharing"},
		{name: "GPUs shared through DRA with dra.sharing", mutate: func(c *Config) {
			c.NodeName = "node-a"
			c.DRA.Kinds = []string{"gpu", "mig"}
			c.DRA.Sharing = true
			c.Sharing.TimeSlicing = ts(gpu.ResourceGPU)
		}},
		{name: "MIG shared while DRA serves MIG", mutate: func(c *Config) {
			c.NodeName = "node-a"
			c.MIGStrategy = "mixed"
			c.DRA.Kinds = []string{"mig"}
			c.Sharing.TimeSlicing = ts("nvidia.com/mig-1g.10gb")
		}, wantErr: "nvidia.com/mig-1g.10gb cannot be shared: dra.devices serves mig devices"},
		{name: "MIG shared while DRA serves GPUs", mutate: func(c *Config) {
			c.NodeName = "node-a"
			c.MIGStrategy = "mixed"
			c.DRA.Kinds = []string{"gpu"}
			c.Sharing.TimeSlicing = ts("nvidia.com/mig-1g.10gb")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := defaults()
			tc.mutate(&c)
			err := c.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestNVIDIAIgnoredLogged: what NVIDIA's file sets that changes nothing is
// logged, one warning per key, naming the file.
func TestNVIDIAIgnoredLogged(t *testing.T) {
	c, err := loadConfig([]string{"--nvidia-config", "testdata/nvidia-config.yaml"}, getenvOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	c.logNVIDIAIgnored(slog.New(slog.NewTextHandler(&buf, nil)))
	out := buf.String()
	for _, want := range []string{
		`level=WARN msg="nvidia-config setting ignored" file=testdata/nvidia-config.yaml key=flags.failOnInitError`,
		`key=sharing.timeSlicing.resources[0].devices why="ignored, as NVIDIA's plugin ignores it`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log\n%s\nhas no %q", out, want)
		}
	}
	if n := strings.Count(out, "\n"); n != 2 {
		t.Errorf("%d lines logged, want 2", n)
	}
}
