package usage

import (
	"strings"
	"testing"
)

// TestParseCgroup reads /proc/<pid>/cgroup files seen on real nodes; each
// case says where it was published. Container IDs and UIDs are as found.
func TestParseCgroup(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    CgroupInfo // Path is not compared
		wantErr string
	}{
		{
			// kubelet pkg/kubelet/stats/cri_stats_provider.go,
			// extractIDFromCgroupPath ("case1 == systemd"), and its test.
			name:    "v2 systemd containerd burstable (kubelet source)",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2fc932ce_fdcc_454b_97bd_aadfdeb4c340.slice/cri-containerd-aaefb9d8feed2d453b543f6d928cede7a4dbefa6a0ae7c9b990dd234c56e93b9.scope\n",
			want: CgroupInfo{PodUID: "2fc932ce-fdcc-454b-97bd-aadfdeb4c340", QoS: QoSBurstable,
				ContainerID: "aaefb9d8feed2d453b543f6d928cede7a4dbefa6a0ae7c9b990dd234c56e93b9", Runtime: RuntimeContainerd},
		},
		{
			// The same function's "case0 == cgroupfs".
			name:    "v2 cgroupfs burstable (kubelet source)",
			content: "0::/kubepods/burstable/pod2fc932ce-fdcc-454b-97bd-aadfdeb4c340/9be25294016e2dc0340dd605ce1f57b492039b267a6a618a7ad2a7a58a740f32\n",
			want: CgroupInfo{PodUID: "2fc932ce-fdcc-454b-97bd-aadfdeb4c340", QoS: QoSBurstable,
				ContainerID: "9be25294016e2dc0340dd605ce1f57b492039b267a6a618a7ad2a7a58a740f32"},
		},
		{
			// opencontainers/runc issue 4620: `cat /proc/21689/cgroup` of
			// calico-node under CRI-O, cgroup v1, systemd driver.
			name: "v1 systemd CRI-O burstable (runc#4620)",
			content: "13:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_434d_add7_4afaafdaef89.slice/crio-5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c.scope\n" +
				"12:cpuset:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_434d_add7_4afaafdaef89.slice/crio-5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c.scope\n" +
				"11:files:/\n",
			want: CgroupInfo{PodUID: "a5c1f8d5-1919-434d-add7-4afaafdaef89", QoS: QoSBurstable,
				ContainerID: "5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c", Runtime: RuntimeCRIO},
		},
		{
			// sustainable-computing-io/kepler issue 153: CRI-O's conmon on
			// RHEL, in the pod's cgroup beside its container.
			name:    "v1 systemd CRI-O conmon (kepler#153)",
			content: "1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb4e8e0dc_caf3_4a43_bf50_f84ef5ef7a8f.slice/crio-conmon-927cffdca4f374600fe49a62bfd7f2e73ea6d37cdafb1bf8f89afb64d7e6c6a5.scope\n",
			want: CgroupInfo{PodUID: "b4e8e0dc-caf3-4a43-bf50-f84ef5ef7a8f", QoS: QoSBurstable,
				ContainerID: "927cffdca4f374600fe49a62bfd7f2e73ea6d37cdafb1bf8f89afb64d7e6c6a5", Runtime: RuntimeCRIO},
		},
		{
			// containerd/nri pull request 227: CRI-O on OpenShift, cgroup
			// v2, the pod sandbox's cgroup (no .scope).
			name:    "v2 systemd CRI-O sandbox (nri#227)",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod35550f44_f691_427e_b57d_ab6127d2cb65.slice/crio-468f848e2ebec7203ed55748d08337851af589ac42eb551c572446a5c68fe631\n",
			want: CgroupInfo{PodUID: "35550f44-f691-427e-b57d-ab6127d2cb65", QoS: QoSBurstable,
				ContainerID: "468f848e2ebec7203ed55748d08337851af589ac42eb551c572446a5c68fe631", Runtime: RuntimeCRIO},
		},
		{
			// The same pull request: CRI-O's container scope, besteffort.
			name:    "v2 systemd CRI-O besteffort container (nri#227)",
			content: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod38186edb_96bd_4383_baf7_3b4edf3b5937.slice/crio-805b902ed98fdc1409c76e9aa94964787a904c80f46fc3ee74283509108f5e73.scope\n",
			want: CgroupInfo{PodUID: "38186edb-96bd-4383-baf7-3b4edf3b5937", QoS: QoSBestEffort,
				ContainerID: "805b902ed98fdc1409c76e9aa94964787a904c80f46fc3ee74283509108f5e73", Runtime: RuntimeCRIO},
		},
		{
			// The same pull request, containerd on kind: the kubelet's
			// --cgroup-root=/kubelet puts pods under kubelet.slice.
			name:    "v2 systemd containerd under a cgroup root (kind, nri#227)",
			content: "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod1e597579_417e_482f_bf65_5fe170c3aebd.slice/cri-containerd-a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e.scope\n",
			want: CgroupInfo{PodUID: "1e597579-417e-482f-bf65-5fe170c3aebd", QoS: QoSBestEffort,
				ContainerID: "a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e", Runtime: RuntimeContainerd},
		},
		{
			// open-telemetry/opentelemetry-java issue 4507: containerd with
			// the systemd driver on cgroup v1; hierarchies systemd does not
			// manage show containerd's raw "slice:prefix:name" path, some
			// under containerd.service.
			name: "v1 containerd slice:prefix:name notation (otel-java#4507)",
			content: "11:perf_event:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459\n" +
				"10:blkio:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459\n",
			want: CgroupInfo{PodUID: "0125ec2f-b64a-4868-8f5b-94b56cbab864", QoS: QoSBestEffort,
				ContainerID: "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459", Runtime: RuntimeContainerd},
		},
		{
			// elastic/apm pull request 508, quoted in
			// elastic/apm-agent-nodejs issue 3550: the name=systemd line.
			name:    "v1 name=systemd under containerd.service (elastic/apm#508)",
			content: "1:name=systemd:/system.slice/containerd.service/kubepods-burstable-podff49d0be_16b7_4a49_bb9e_8ec1f1f4e27f.slice:cri-containerd:0f99ad5f45163ed14ab8eaf92ed34bb4a631d007f8755a7d79be614bcb0df0ef\n",
			want: CgroupInfo{PodUID: "ff49d0be-16b7-4a49-bb9e-8ec1f1f4e27f", QoS: QoSBurstable,
				ContainerID: "0f99ad5f45163ed14ab8eaf92ed34bb4a631d007f8755a7d79be614bcb0df0ef", Runtime: RuntimeContainerd},
		},
		{
			// lxc/lxc issue 3890: Docker (dockershim) with the systemd
			// driver, cgroup v1.
			name: "v1 systemd docker burstable (lxc#3890)",
			content: "12:rdma:/\n" +
				"11:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d4424e6_bb13_42f4_a47a_45a4828bf54d.slice/docker-d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98.scope\n",
			want: CgroupInfo{PodUID: "7d4424e6-bb13-42f4-a47a-45a4828bf54d", QoS: QoSBurstable,
				ContainerID: "d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98", Runtime: RuntimeDocker},
		},
		{
			// genuinetools/amicontained issue 7: Kubernetes 1.7 with Docker,
			// cgroupfs driver, cgroup v1.
			name: "v1 cgroupfs docker besteffort (amicontained#7)",
			content: "11:memory:/kubepods/besteffort/pod6c85216c-82ad-11e7-9fb0-061c2985ea4a/162a25c865d3117f158a598f94b1a14436519ba18c8c1969727b9d3f7bdee25e\n" +
				"10:pids:/kubepods/besteffort/pod6c85216c-82ad-11e7-9fb0-061c2985ea4a/162a25c865d3117f158a598f94b1a14436519ba18c8c1969727b9d3f7bdee25e\n",
			want: CgroupInfo{PodUID: "6c85216c-82ad-11e7-9fb0-061c2985ea4a", QoS: QoSBestEffort,
				ContainerID: "162a25c865d3117f158a598f94b1a14436519ba18c8c1969727b9d3f7bdee25e"},
		},
		{
			// peass-ng/PEASS-ng pull request 124: a pod's container, cgroup
			// v1 cgroupfs, with an unused rdma hierarchy first.
			name: "v1 cgroupfs besteffort (PEASS-ng#124)",
			content: "12:rdma:/\n" +
				"11:memory:/kubepods/besteffort/pod4eede96e-e976-4573-bc90-68dfe2516d3b/c3cd4e0a7993a1c155cc1bdd3326c7b1e260226d0c2c79e3e48dbc360543c768\n",
			want: CgroupInfo{PodUID: "4eede96e-e976-4573-bc90-68dfe2516d3b", QoS: QoSBestEffort,
				ContainerID: "c3cd4e0a7993a1c155cc1bdd3326c7b1e260226d0c2c79e3e48dbc360543c768"},
		},
		{
			// netdata/netdata issue 4868: a static pod's cgroup (its UID is
			// the 32-hex hash of its manifest, no dashes) under containerd.
			name:    "v1 systemd static pod UID (netdata#4868)",
			content: "3:blkio:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod03671a0313f5acf27bef3683009923f8.slice/cri-containerd-33b76b55c057401e680c81463a405421c2bf172c8fdc95d13715ac35126bf355.scope\n",
			want: CgroupInfo{PodUID: "03671a0313f5acf27bef3683009923f8", QoS: QoSBurstable,
				ContainerID: "33b76b55c057401e680c81463a405421c2bf172c8fdc95d13715ac35126bf355", Runtime: RuntimeContainerd},
		},
		{
			// kubelet pkg/kubelet/cm/cgroup_manager_linux_test.go
			// (TestCgroupNameToSystemd): a guaranteed pod sits directly
			// under kubepods; CRI-O's container scope inside it.
			name:    "v2 systemd guaranteed (kubelet naming)",
			content: "0::/kubepods.slice/kubepods-pod6c1a4e95_6bb6_11e6_bc26_28d2444e470d.slice/crio-805b902ed98fdc1409c76e9aa94964787a904c80f46fc3ee74283509108f5e73.scope\n",
			want: CgroupInfo{PodUID: "6c1a4e95-6bb6-11e6-bc26-28d2444e470d", QoS: QoSGuaranteed,
				ContainerID: "805b902ed98fdc1409c76e9aa94964787a904c80f46fc3ee74283509108f5e73", Runtime: RuntimeCRIO},
		},
		{
			// crun issue 729: the pod cgroup seen in mountinfo, cgroupfs
			// guaranteed layout; as a v2 line.
			name:    "v2 cgroupfs guaranteed",
			content: "0::/kubepods/pod85401dd3-38cd-47b6-a90a-e16c0e1c06e6/dbc9f149296cec5d12b78385eb5b2c0cfe20b476f117c15c76d981cff44053c1\n",
			want: CgroupInfo{PodUID: "85401dd3-38cd-47b6-a90a-e16c0e1c06e6", QoS: QoSGuaranteed,
				ContainerID: "dbc9f149296cec5d12b78385eb5b2c0cfe20b476f117c15c76d981cff44053c1"},
		},
		{
			// cgroup_namespaces(7): read from a cgroup namespace whose root
			// is elsewhere (the agent's own container's, with containerd's
			// private cgroupns), ancestors show as "..".
			name:    "v2 read from another cgroup namespace",
			content: "0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod38186edb_96bd_4383_baf7_3b4edf3b5937.slice/cri-containerd-805b902ed98fdc1409c76e9aa94964787a904c80f46fc3ee74283509108f5e73.scope\n",
			want: CgroupInfo{PodUID: "38186edb-96bd-4383-baf7-3b4edf3b5937", QoS: QoSBestEffort,
				ContainerID: "805b902ed98fdc1409c76e9aa94964787a904c80f46fc3ee74283509108f5e73", Runtime: RuntimeContainerd},
		},
		{
			// A process directly in the pod cgroup (no container segment).
			name:    "v2 pod cgroup itself",
			content: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod38186edb_96bd_4383_baf7_3b4edf3b5937.slice\n",
			want:    CgroupInfo{PodUID: "38186edb-96bd-4383-baf7-3b4edf3b5937", QoS: QoSBestEffort},
		},
		{
			// kepler#153 again: containerd itself, a host process.
			name:    "v2 host service",
			content: "0::/system.slice/containerd.service\n",
			want:    CgroupInfo{},
		},
		{
			// siderolabs/talos pull request 3950: `cat /proc/1/cgroup`.
			name:    "v2 init",
			content: "0::/init\n",
			want:    CgroupInfo{},
		},
		{
			// d2iq-archive/kubernetes-mesos issue 565, from the host: PID 1.
			name: "v1 host root",
			content: "12:name=systemd:/\n11:hugetlb:/\n10:net_prio:/\n9:perf_event:/\n8:blkio:/\n" +
				"7:net_cls:/\n6:freezer:/\n5:devices:/\n4:memory:/\n3:cpuacct:/\n2:cpu:/\n1:cpuset:/\n",
			want: CgroupInfo{},
		},
		{
			// A GPU manager's source comment (built on tkestack.io/nvml,
			// Ubuntu 20.04): "docker proc", a container Docker runs outside
			// Kubernetes, is outside every pod.
			name:    "v2 docker container outside Kubernetes",
			content: "0::/system.slice/docker-293f758723d0652a0b9fa869106e600079e56dae362ca84de12942d38524a272.scope\n",
			want:    CgroupInfo{},
		},
		{
			// Hybrid (systemd's unified tracking plus v1 controllers): the
			// unified line is "/" and the pod is on the v1 lines.
			name: "hybrid: pod only on v1 lines",
			content: "0::/\n" +
				"4:memory:/kubepods/besteffort/pod4eede96e-e976-4573-bc90-68dfe2516d3b/c3cd4e0a7993a1c155cc1bdd3326c7b1e260226d0c2c79e3e48dbc360543c768\n",
			want: CgroupInfo{PodUID: "4eede96e-e976-4573-bc90-68dfe2516d3b", QoS: QoSBestEffort,
				ContainerID: "c3cd4e0a7993a1c155cc1bdd3326c7b1e260226d0c2c79e3e48dbc360543c768"},
		},
		{
			name:    "a pod segment with a malformed UID is no pod",
			content: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podnot_a_uid.slice/x.scope\n",
			want:    CgroupInfo{},
		},
		{
			name:    "a podman-style slice is no pod",
			content: "0::/machine.slice/libpod-pod38186edb_96bd_4383_baf7_3b4edf3b5937.slice\n",
			want:    CgroupInfo{},
		},
		{name: "empty file", content: "", wantErr: "empty cgroup file"},
		{name: "not a cgroup file", content: "hello world\n", wantErr: "no cgroup line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCgroup(tt.content)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseCgroup() error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseCgroup(): %v", err)
			}
			got.Path = ""
			if got != tt.want {
				t.Errorf("ParseCgroup() = %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func FuzzParseCgroup(f *testing.F) {
	f.Add("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2fc932ce_fdcc_454b_97bd_aadfdeb4c340.slice/cri-containerd-aaefb9d8feed2d453b543f6d928cede7a4dbefa6a0ae7c9b990dd234c56e93b9.scope\n")
	f.Add("11:memory:/kubepods/besteffort/pod6c85216c-82ad-11e7-9fb0-061c2985ea4a/162a25c865d3117f158a598f94b1a14436519ba18c8c1969727b9d3f7bdee25e\n")
	f.Fuzz(func(t *testing.T, s string) {
		info, err := ParseCgroup(s)
		if err != nil {
			return
		}
		if info.PodUID != "" && len(info.PodUID) != 32 && len(info.PodUID) != 36 {
			t.Errorf("pod UID %q of %q", info.PodUID, s)
		}
		if info.ContainerID != "" && !isContainerID(info.ContainerID) {
			t.Errorf("container ID %q of %q", info.ContainerID, s)
		}
	})
}
