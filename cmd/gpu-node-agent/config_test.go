//go:build simulator

package main

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/agent"
	"github.com/gpu-node-agent/gpu-node-agent/remediate"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigPrecedence(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(t *testing.T, c Config)
	}{
		{
			name: "defaults",
			check: func(t *testing.T, c Config) {
				want := defaults()
				if !reflect.DeepEqual(c, want) {
					t.Errorf("got %+v, want defaults %+v", c, want)
				}
			},
		},
		{
			name: "file over defaults",
			args: []string{"--config", "testdata/config.yaml"},
			check: func(t *testing.T, c Config) {
				if c.MIGStrategy != "mixed" || c.DeviceListStrategy != "cdi-cri" || !c.PassDeviceSpecs ||
					c.DevicePluginDir != "/tmp/from-file" || c.RescanInterval.Duration != 10*time.Second || c.Simulate != "dgx-a100" || c.LogLevel != "debug" {
					t.Errorf("file not applied: %+v", c)
				}
				if c.MetricsAddress != ":9400" || c.HostRoot != "/" {
					t.Errorf("defaults not kept for keys absent from the file: %+v", c)
				}
			},
		},
		{
			name: "dra section",
			args: []string{"--config", "testdata/dra.yaml"},
			check: func(t *testing.T, c Config) {
				want := agent.DRAConfig{Kinds: []string{"gpu", "nic"}, KubeletDir: "/var/lib/k", CDIDir: "/run/cdi", NoExecute: true}
				if !reflect.DeepEqual(c.DRA, want) {
					t.Errorf("dra = %+v, want %+v", c.DRA, want)
				}
				if got := c.agentConfig("/").DRA; !reflect.DeepEqual(got, want) {
					t.Errorf("agent's dra = %+v, want %+v", got, want)
				}
			},
		},
		{
			name: "config file named by env",
			env:  map[string]string{"GNA_CONFIG": "testdata/config.yaml"},
			check: func(t *testing.T, c Config) {
				if c.MIGStrategy != "mixed" || c.Config != "testdata/config.yaml" {
					t.Errorf("GNA_CONFIG not read: %+v", c)
				}
			},
		},
		{
			name: "env over file",
			args: []string{"--config", "testdata/config.yaml"},
			env:  map[string]string{"GNA_MIG_STRATEGY": "single", "GNA_PASS_DEVICE_SPECS": "false", "GNA_RESCAN_INTERVAL": "1m", "NODE_NAME": "node-a"},
			check: func(t *testing.T, c Config) {
				if c.MIGStrategy != "single" || c.PassDeviceSpecs || c.RescanInterval.Duration != time.Minute || c.NodeName != "node-a" {
					t.Errorf("env not applied over file: %+v", c)
				}
				if c.DeviceListStrategy != "cdi-cri" {
					t.Errorf("file value lost: %+v", c)
				}
			},
		},
		{
			name: "flag over env over file",
			args: []string{"--config", "testdata/config.yaml", "--mig-strategy", "none", "--node-name=node-b", "--pass-device-specs=true", "--rescan-interval", "5s"},
			env:  map[string]string{"GNA_MIG_STRATEGY": "single", "GNA_PASS_DEVICE_SPECS": "false", "NODE_NAME": "node-a", "GNA_DEVICE_LIST_STRATEGY": "volume-mounts"},
			check: func(t *testing.T, c Config) {
				if c.MIGStrategy != "none" || c.NodeName != "node-b" || !c.PassDeviceSpecs || c.RescanInterval.Duration != 5*time.Second {
					t.Errorf("flags not applied over env: %+v", c)
				}
				if c.DeviceListStrategy != "volume-mounts" {
					t.Errorf("env value for an unflagged option lost: %+v", c)
				}
			},
		},
		{
			name: "GNA_NODE_NAME is not the env var for node-name",
			env:  map[string]string{"GNA_NODE_NAME": "wrong"},
			check: func(t *testing.T, c Config) {
				if c.NodeName != "" {
					t.Errorf("node name = %q", c.NodeName)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, env(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestConfigLoadErrors(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{name: "unknown key in file", args: []string{"--config", "testdata/unknown-key.yaml"}, wantErr: `unknown field "mig-stratgy"`},
		{name: "duration as number in file", args: []string{"--config", "testdata/bad-duration.yaml"}, wantErr: `must be a string such as "30s"`},
		{name: "missing file", args: []string{"--config", "testdata/nope.yaml"}, wantErr: "no such file"},
		{name: "bad env bool", env: map[string]string{"GNA_PASS_DEVICE_SPECS": "yes please"}, wantErr: `pass-device-specs: env GNA_PASS_DEVICE_SPECS="yes please"`},
		{name: "bad env duration", env: map[string]string{"GNA_RESCAN_INTERVAL": "soon"}, wantErr: "rescan-interval: env GNA_RESCAN_INTERVAL"},
		{name: "unknown flag", args: []string{"--mig"}, wantErr: "flag provided but not defined: -mig"},
		{name: "unknown key in dra section", args: []string{"--config", "testdata/dra-unknown-key.yaml"}, wantErr: `unknown field "device"`},
		{name: "unknown key in preflight section", args: []string{"--config", "testdata/preflight-unknown-key.yaml"},
			wantErr: `preflight.pcie.failIdleDowngrades: unknown key (known: failIdleDowngrade)`},
		{name: "unknown key in remediation section", args: []string{"--config", "testdata/remediation-bad.yaml"},
			wantErr: `remediation.reset.retryWindw: unknown key`},
		{name: "bad flag duration", args: []string{"--exit-after", "3"}, wantErr: `invalid value "3" for flag -exit-after`},
		{name: "stray argument", args: []string{"--simulate", "dgx-h100", "extra"}, wantErr: `unexpected argument "extra"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(tc.args, env(tc.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	if _, err := loadConfig([]string{"--help"}, env(nil), io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: error = %v, want flag.ErrHelp", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(c *Config)
		wantErr string
	}{
		{name: "defaults are valid", mutate: func(*Config) {}},
		{name: "remediation without a node name", mutate: func(c *Config) { c.Remediation.Reset.Enabled = true },
			wantErr: "remediation: the enabled steps need node-name"},
		{name: "remediation drain without reset", mutate: func(c *Config) { c.NodeName = "n"; c.Remediation.Drain.Enabled = true },
			wantErr: "remediation.drain.enabled needs remediation.reset.enabled"},
		{name: "remediation reset timeout", mutate: func(c *Config) {
			c.NodeName = "n"
			c.Remediation.Reset.Enabled = true
			c.Remediation.Reset.Timeout = remediate.Duration(-time.Second)
		}, wantErr: "remediation.reset.timeout -1s: must be > 0"},
		{name: "remediation dry run", mutate: func(c *Config) {
			c.NodeName = "n"
			c.Remediation.Reset = remediate.ResetConfig{Enabled: true, DryRun: true}
		}},
		{name: "simulate with control address", mutate: func(c *Config) { c.Simulate = "dgx-h100,mig=0:1g.10gb+2g.20gb"; c.SimControlAddress = "[::1]:9402" }},
		{name: "mig-strategy", mutate: func(c *Config) { c.MIGStrategy = "foo" }, wantErr: `mig-strategy: "foo" is not one of none, single, mixed`},
		{name: "device-list-strategy", mutate: func(c *Config) { c.DeviceListStrategy = "cdi-annotations" }, wantErr: `device-list-strategy: "cdi-annotations" is not one of envvar, volume-mounts, cdi-cri`},
		{name: "empty mig-strategy", mutate: func(c *Config) { c.MIGStrategy = "" }, wantErr: "mig-strategy: must not be empty"},
		{name: "device-plugin-dir", mutate: func(c *Config) { c.DevicePluginDir = "" }, wantErr: "device-plugin-dir: must not be empty"},
		{name: "host-root missing", mutate: func(c *Config) { c.HostRoot = "/nonexistent/host" }, wantErr: `host-root: "/nonexistent/host" is not a directory`},
		{name: "host-root missing is fine when simulating", mutate: func(c *Config) { c.HostRoot = "/nonexistent/host"; c.Simulate = "dgx-h100" }},
		{name: "simulate syntax", mutate: func(c *Config) { c.Simulate = "dgx-h100,mig=x:1g.10gb" }, wantErr: "simulate: "},
		{name: "simulate unknown profile", mutate: func(c *Config) { c.Simulate = "dgx-z1" }, wantErr: `simulate: unknown profile "dgx-z1" (known: `},
		{name: "simulate missing snapshot", mutate: func(c *Config) { c.Simulate = "testdata/nope.json" }, wantErr: "simulate: snapshot stat testdata/nope.json: no such file"},
		{name: "sim-faults", mutate: func(c *Config) { c.Simulate = "dgx-h100"; c.SimFaults = "nvml-failure,gpu-lost:3" }},
		{name: "sim-faults without a GPU index", mutate: func(c *Config) { c.Simulate = "dgx-h100"; c.SimFaults = "gpu-lost:x" }, wantErr: `sim-faults: "gpu-lost:x": want KIND:GPU with a GPU index`},
		{name: "simulate repeated gpu", mutate: func(c *Config) { c.Simulate = "dgx-h100,mig=0:1g.10gb,mig=0:2g.20gb" }, wantErr: "mig layout for gpu 0 given twice"},
		{name: "sim-control-address not loopback", mutate: func(c *Config) { c.Simulate = "dgx-h100"; c.SimControlAddress = "0.0.0.0:9402" }, wantErr: `sim-control-address: "0.0.0.0:9402" is not a loopback address`},
		{name: "sim-control-address ignored without simulate", mutate: func(c *Config) { c.SimControlAddress = "0.0.0.0:9402" }},
		{name: "rescan-interval", mutate: func(c *Config) { c.RescanInterval.Duration = -time.Second }, wantErr: "rescan-interval: -1s is negative"},
		{name: "exit-after", mutate: func(c *Config) { c.ExitAfter.Duration = -time.Second }, wantErr: "exit-after: -1s is negative"},
		{name: "metrics-address", mutate: func(c *Config) { c.MetricsAddress = "9400" }, wantErr: `metrics-address: "9400" is not host:port`},
		{name: "metrics.dcgmNames", mutate: func(c *Config) { c.Metrics.DCGMNames = "new" }, wantErr: `metrics.dcgmNames "new": must be legacy, both or current`},
		{name: "metrics.dcgmNames both", mutate: func(c *Config) { c.Metrics.DCGMNames = "both" }},
		{name: "node-name", mutate: func(c *Config) { c.NodeName = "Node_A" }, wantErr: `node-name: "Node_A" is not a valid node name`},
		{name: "kube-api-qps", mutate: func(c *Config) { c.KubeAPIQPS = -1 }, wantErr: "kube-api-qps -1: must be positive"},
		{name: "kube-api-burst", mutate: func(c *Config) { c.KubeAPIBurst = -2 }, wantErr: "kube-api-burst -2: must be at least 1"},
		{name: "log-format", mutate: func(c *Config) { c.LogFormat = "xml" }, wantErr: `log-format: "xml" is not one of text, json`},
		{name: "log-level", mutate: func(c *Config) { c.LogLevel = "verbose" }, wantErr: `log-level: "verbose" is not one of debug, info, warn, error`},
		{name: "dra", mutate: func(c *Config) { c.NodeName = "node-a"; c.DRA.Kinds = []string{"gpu", "mig", "nic"} }},
		{name: "dra gpu alone under mixed", mutate: func(c *Config) { c.NodeName = "node-a"; c.MIGStrategy = "mixed"; c.DRA.Kinds = []string{"gpu"} }},
		{name: "dra gpu without mig", mutate: func(c *Config) { c.NodeName = "node-a"; c.DRA.Kinds = []string{"gpu", "nic"} },
			wantErr: "dra.devices: gpu and mig must be listed together unless mig-strategy is mixed (it is none)"},
		{name: "dra mig on demand", mutate: func(c *Config) { c.NodeName = "node-a"; c.DRA.Kinds = []string{"gpu", "mig"}; c.DRA.MIGOnDemand = true }},
		{name: "dra mig on demand without mig", mutate: func(c *Config) {
			c.NodeName = "node-a"
			c.MIGStrategy = "mixed"
			c.DRA.Kinds = []string{"gpu"}
			c.DRA.MIGOnDemand = true
		}, wantErr: "dra.migOnDemand: MIG devices are made on demand only when DRA serves them: add mig to dra.devices"},
		{name: "dra unknown kind", mutate: func(c *Config) { c.NodeName = "node-a"; c.DRA.Kinds = []string{"nic", "fpga"} }, wantErr: `dra.devices: unknown device kind "fpga" (want gpu, mig, nic)`},
		{name: "dra kind twice", mutate: func(c *Config) { c.NodeName = "node-a"; c.DRA.Kinds = []string{"nic", "nic"} }, wantErr: `dra.devices: device kind "nic" listed twice`},
		{name: "dra without node-name", mutate: func(c *Config) { c.DRA.Kinds = []string{"nic"} }, wantErr: "dra.devices: serving devices through DRA needs node-name"},
		{name: "dra without state-dir", mutate: func(c *Config) { c.NodeName = "node-a"; c.StateDir = ""; c.DRA.Kinds = []string{"nic"} }, wantErr: "dra.devices: serving devices through DRA needs state-dir"},
		{name: "dra relative dirs", mutate: func(c *Config) { c.DRA.KubeletDir = "kubelet"; c.DRA.CDIDir = "cdi" }, wantErr: "dra.kubeletDir: \"kubelet\" is not an absolute path\ndra.cdiDir: \"cdi\" is not an absolute path"},
		{name: "several errors reported together", mutate: func(c *Config) { c.LogFormat = "xml"; c.MIGStrategy = "foo" }, wantErr: "mig-strategy: \"foo\" is not one of none, single, mixed\nlog-format"},
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

func TestParseSimulate(t *testing.T) {
	tests := []struct {
		in      string
		want    simSpec
		wantErr string
	}{
		{in: "dgx-h100", want: simSpec{profile: "dgx-h100"}},
		{in: "nodes/a.json", want: simSpec{file: "nodes/a.json"}},
		{in: "capture:test/hardware/captures/h200", want: simSpec{file: "test/hardware/captures/h200/agent/topology.json"}},
		{in: "capture:", wantErr: "want capture:DIR"},
		{in: "dgx-h100,mig=0:1g.10gb+1g.10gb+me+3g.40gb,mig=3:7g.80gb", want: simSpec{profile: "dgx-h100", mig: []simMIG{
			{gpu: 0, profiles: []string{"1g.10gb", "1g.10gb+me", "3g.40gb"}},
			{gpu: 3, profiles: []string{"7g.80gb"}},
		}}},
		{in: ",mig=0:1g.10gb", wantErr: "has no profile name"},
		{in: "dgx-h100,foo=1", wantErr: `want mig=GPU:PROFILE+PROFILE..., got "foo=1"`},
		{in: "dgx-h100,mig=1g.10gb", wantErr: "with a GPU index"},
		{in: "dgx-h100,mig=-1:1g.10gb", wantErr: "with a GPU index"},
		{in: "dgx-h100,mig=2:", wantErr: "mig layout for gpu 2 is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseSimulate(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want.String() || got.file != tc.want.file || len(got.mig) != len(tc.want.mig) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got.mig {
				if got.mig[i].gpu != tc.want.mig[i].gpu || strings.Join(got.mig[i].profiles, " ") != strings.Join(tc.want.mig[i].profiles, " ") {
					t.Errorf("mig[%d] = %+v, want %+v", i, got.mig[i], tc.want.mig[i])
				}
			}
		})
	}
}

func TestConfigStateDir(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		simulate string
		hostRoot string
		want     string // health.Config.StateDir
		wantErr  string
	}{
		{name: "default", hostRoot: "/", want: "/var/lib/gpu-node-agent"},
		{name: "flag", args: []string{"--state-dir", "/data/gna"}, hostRoot: "/", want: "/data/gna"},
		{name: "env", env: map[string]string{"GNA_STATE_DIR": "/env/gna"}, hostRoot: "/", want: "/env/gna"},
		{name: "empty flag disables", args: []string{"--state-dir="}, hostRoot: "/", want: ""},
		{name: "simulate moves the default under the host root", simulate: "dgx-h100", hostRoot: "/tmp/sim-root", want: "/tmp/sim-root/var/lib/gpu-node-agent"},
		{name: "simulate keeps an explicit dir", args: []string{"--state-dir", "/data/gna"}, simulate: "dgx-h100", hostRoot: "/tmp/sim-root", want: "/data/gna"},
		{name: "relative dir rejected", args: []string{"--state-dir", "state"}, hostRoot: "/", wantErr: `state-dir: "state" is not an absolute path`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, env(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			c.Simulate = tc.simulate
			err = c.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			h := c.healthConfig(tc.hostRoot)
			if h.StateDir != tc.want || h.HostRoot != tc.hostRoot {
				t.Fatalf("health StateDir %q HostRoot %q, want %q %q", h.StateDir, h.HostRoot, tc.want, tc.hostRoot)
			}
		})
	}
}
