package health

import "slices"

// XIDClass is what an XID asks of the node, after the resolution bucket
// ("immediate action") NVIDIA's XID catalog gives it.
type XIDClass string

// XID classes.
const (
	// XIDClassApp is an application error (catalog bucket RESTART_APP, or
	// one of the XIDs NVIDIA's device plugin skips as application errors):
	// counted, never makes a device unfit, never taints.
	XIDClassApp XIDClass = "app"
	// XIDClassReset needs a GPU reset (RESET_GPU, WORKFLOW_XID_48): the
	// device is unfit and held so until there is evidence of a reset.
	XIDClassReset XIDClass = "reset"
	// XIDClassReboot needs a node reboot (RESTART_BM, RESTART_VM): held
	// like XIDClassReset; a GPU reset or a reboot releases it.
	XIDClassReboot XIDClass = "reboot"
	// XIDClassNVLink follows the catalog's NVLink workflow
	// (WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR): the device is unfit
	// and recovers as an event does; the nvlink check reports a link that
	// stays down.
	XIDClassNVLink XIDClass = "nvlink"
	// XIDClassInfo is informational or unexpected (IGNORE, CHECK_*,
	// UPDATE_SWFW, UNEXPECTED_ERR_REPORT_ISSUE, XID 154 which defers to
	// another XID) and every XID the table does not know: only counted.
	XIDClassInfo XIDClass = "info"
)

// holds says whether a fatal XID of class c keeps its device unfit until a
// reset rather than recovering after the recovery period.
func (c XIDClass) holds() bool { return c == XIDClassReset || c == XIDClassReboot }

// fatal says whether an XID of class c makes a device unfit by default.
func (c XIDClass) fatal() bool { return c != XIDClassApp && c != XIDClassInfo }

// XIDEntry is one row of the XID table.
type XIDEntry struct {
	XID   uint64
	Class XIDClass
	// Mnemonic is the catalog's name (e.g. ROBUST_CHANNEL_GPU_ECC_DBE).
	Mnemonic string
	// Bucket is the catalog's immediate-action resolution bucket.
	Bucket string
	// Meaning is a short human description.
	Meaning string
	// Source says where the class comes from (see the source* constants).
	Source string
}

// Sources of the XID table. The catalog rows were taken from NVIDIA's XID
// catalog for Ampere and newer GPUs ("Analyzing Xid Errors with the Xid
// Catalog", https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
// column "Resolution Bucket (Immediate Action)"), as NVIDIA ships it in
// NVSentinel's distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv
// at commit 6f8b0fcfa8e502bdda78fabf96facef729a9285b. The application
// XIDs are those NVIDIA's k8s-device-plugin skips in internal/rm/health.go
// (getDisabledHealthCheckXids, "Application errors: the GPU should still
// be healthy") at commit 02597b97a66aee924ae59788e8de24955d07f2d0.
const (
	sourceCatalog                = "xid-catalog"
	sourceDevicePlugin           = "k8s-device-plugin (catalog: RESET_GPU for 109, IGNORE for 43)"
	sourceCatalogAndDevicePlugin = "xid-catalog, k8s-device-plugin"
)

// xidTable is sorted by XID. Where the device plugin calls an XID an
// application error but the catalog mapping puts it in another bucket
// (43: IGNORE, 109: RESET_GPU), the device plugin wins: a context-switch
// timeout is raised for a channel that stopped responding, which a
// misbehaving application causes as often as a GPU, and tainting a node
// for every such job would let one user drain the fleet.
var xidTable = []XIDEntry{
	{1, XIDClassInfo, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", "fifo error fifo method", sourceCatalog},
	{2, XIDClassInfo, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", "fifo error sw method", sourceCatalog},
	{3, XIDClassInfo, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", "fifo error unk method", sourceCatalog},
	{4, XIDClassInfo, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "UNEXPECTED_ERR_REPORT_ISSUE", "fifo error channel busy", sourceCatalog},
	{5, XIDClassInfo, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "UNEXPECTED_ERR_REPORT_ISSUE", "fifo error runout overflow", sourceCatalog},
	{6, XIDClassInfo, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "UNEXPECTED_ERR_REPORT_ISSUE", "fifo error parse err", sourceCatalog},
	{7, XIDClassInfo, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "UNEXPECTED_ERR_REPORT_ISSUE", "fifo error pte err", sourceCatalog},
	{8, XIDClassApp, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP", "GPU stopped processing (channel idle timeout)", sourceCatalog},
	{9, XIDClassInfo, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "UNEXPECTED_ERR_REPORT_ISSUE", "gr error instance", sourceCatalog},
	{10, XIDClassInfo, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "UNEXPECTED_ERR_REPORT_ISSUE", "gr error single step", sourceCatalog},
	{11, XIDClassApp, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "RESTART_APP", "gr error missing hw", sourceCatalog},
	{12, XIDClassInfo, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", "gr error sw method", sourceCatalog},
	{13, XIDClassApp, "ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP", "graphics engine exception", sourceCatalogAndDevicePlugin},
	{14, XIDClassInfo, "ROBUST_CHANNEL_FAKE_ERROR", "IGNORE", "fake error", sourceCatalog},
	{15, XIDClassInfo, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", "scanline timeout", sourceCatalog},
	{16, XIDClassInfo, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", "vblank callback timeout", sourceCatalog},
	{17, XIDClassInfo, "ROBUST_CHANNEL_PARAMETER_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "parameter error", sourceCatalog},
	{18, XIDClassInfo, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "bus master timeout error", sourceCatalog},
	{19, XIDClassInfo, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "UNEXPECTED_ERR_REPORT_ISSUE", "disp missed notifier", sourceCatalog},
	{20, XIDClassInfo, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", "mpeg error sw method", sourceCatalog},
	{21, XIDClassInfo, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", "me error sw method", sourceCatalog},
	{22, XIDClassInfo, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", "vp error sw method", sourceCatalog},
	{23, XIDClassInfo, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "UNEXPECTED_ERR_REPORT_ISSUE", "rc logging enabled", sourceCatalog},
	{24, XIDClassInfo, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", "gr semaphore timeout", sourceCatalog},
	{25, XIDClassApp, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "RESTART_APP", "gr illegal notify", sourceCatalog},
	{26, XIDClassInfo, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", "fifo error fbistate timeout", sourceCatalog},
	{27, XIDClassInfo, "ROBUST_CHANNEL_VP_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "vp error", sourceCatalog},
	{28, XIDClassInfo, "ROBUST_CHANNEL_VP2_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "vp2 error", sourceCatalog},
	{29, XIDClassInfo, "ROBUST_CHANNEL_BSP_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "bsp error", sourceCatalog},
	{30, XIDClassInfo, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "UNEXPECTED_ERR_REPORT_ISSUE", "bad addr access", sourceCatalog},
	{31, XIDClassApp, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP", "GPU memory page fault", sourceCatalogAndDevicePlugin},
	{32, XIDClassApp, "ROBUST_CHANNEL_PBDMA_ERROR", "RESTART_APP", "invalid or corrupted push buffer stream", sourceCatalog},
	{33, XIDClassInfo, "ROBUST_CHANNEL_SEC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "sec error", sourceCatalog},
	{34, XIDClassInfo, "ROBUST_CHANNEL_MSVLD_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "msvld error", sourceCatalog},
	{35, XIDClassInfo, "ROBUST_CHANNEL_MSPDEC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "mspdec error", sourceCatalog},
	{36, XIDClassInfo, "ROBUST_CHANNEL_MSPPP_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "msppp error", sourceCatalog},
	{37, XIDClassInfo, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "IGNORE", "fecs err unimp firmware method", sourceCatalog},
	{38, XIDClassInfo, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE", "fecs err watchdog timeout", sourceCatalog},
	{39, XIDClassApp, "ROBUST_CHANNEL_CE0_ERROR", "RESTART_APP", "ce0 error", sourceCatalog},
	{40, XIDClassApp, "ROBUST_CHANNEL_CE1_ERROR", "RESTART_APP", "ce1 error", sourceCatalog},
	{41, XIDClassApp, "ROBUST_CHANNEL_CE2_ERROR", "RESTART_APP", "ce2 error", sourceCatalog},
	{42, XIDClassInfo, "ROBUST_CHANNEL_VIC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "vic error", sourceCatalog},
	{43, XIDClassApp, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", "GPU stopped processing (channel reset by RM)", sourceDevicePlugin},
	{44, XIDClassInfo, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "IGNORE", "gr fault during ctxsw", sourceCatalog},
	{45, XIDClassApp, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45", "preemptive cleanup after previous errors", sourceCatalogAndDevicePlugin},
	{46, XIDClassReset, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU", "GPU stopped processing", sourceCatalog},
	{47, XIDClassInfo, "ROBUST_CHANNEL_NVENC0_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "nvenc0 error", sourceCatalog},
	{48, XIDClassReset, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", "double-bit ECC error", sourceCatalog},
	{49, XIDClassInfo, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "UNEXPECTED_ERR_REPORT_ISSUE", "silent running constant level set by registry", sourceCatalog},
	{50, XIDClassInfo, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "silent running level transition due to rc error", sourceCatalog},
	{51, XIDClassInfo, "SILENT_RUNNING_STRESS_TEST_FAILURE", "UNEXPECTED_ERR_REPORT_ISSUE", "silent running stress test failure", sourceCatalog},
	{52, XIDClassInfo, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "UNEXPECTED_ERR_REPORT_ISSUE", "silent running level trans due to temp rise", sourceCatalog},
	{53, XIDClassInfo, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "UNEXPECTED_ERR_REPORT_ISSUE", "silent running temp reduced clocking", sourceCatalog},
	{54, XIDClassInfo, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS", "power-reduced clocking", sourceCatalog},
	{55, XIDClassInfo, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "silent running temperature read error", sourceCatalog},
	{56, XIDClassInfo, "DISPLAY_CHANNEL_EXCEPTION", "UNEXPECTED_ERR_REPORT_ISSUE", "display channel exception", sourceCatalog},
	{57, XIDClassInfo, "FB_LINK_TRAINING_FAILURE_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "fb link training failure error", sourceCatalog},
	{58, XIDClassInfo, "FB_MEMORY_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "fb memory error", sourceCatalog},
	{59, XIDClassInfo, "PMU_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "pmu error", sourceCatalog},
	{60, XIDClassApp, "ROBUST_CHANNEL_SEC2_ERROR", "RESTART_APP", "sec2 error", sourceCatalog},
	{61, XIDClassInfo, "PMU_BREAKPOINT", "UNEXPECTED_ERR_REPORT_ISSUE", "pmu breakpoint", sourceCatalog},
	{62, XIDClassReset, "PMU_HALT_ERROR", "RESET_GPU", "internal micro-controller halt", sourceCatalog},
	{63, XIDClassInfo, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE", "page retirement or row remap recorded", sourceCatalog},
	{64, XIDClassReset, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", "page retirement or row remap failure", sourceCatalog},
	{65, XIDClassInfo, "ROBUST_CHANNEL_NVENC1_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "nvenc1 error", sourceCatalog},
	{66, XIDClassInfo, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE", "fecs err reg access violation", sourceCatalog},
	{67, XIDClassInfo, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE", "fecs err verif violation", sourceCatalog},
	{68, XIDClassApp, "ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP", "video decoder exception", sourceCatalogAndDevicePlugin},
	{69, XIDClassApp, "ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP", "gr class error", sourceCatalog},
	{70, XIDClassApp, "ROBUST_CHANNEL_CE3_ERROR", "RESTART_APP", "ce3 error", sourceCatalog},
	{71, XIDClassApp, "ROBUST_CHANNEL_CE4_ERROR", "RESTART_APP", "ce4 error", sourceCatalog},
	{72, XIDClassApp, "ROBUST_CHANNEL_CE5_ERROR", "RESTART_APP", "ce5 error", sourceCatalog},
	{73, XIDClassInfo, "ROBUST_CHANNEL_NVENC2_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "nvenc2 error", sourceCatalog},
	{74, XIDClassNVLink, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", "NVLink error", sourceCatalog},
	{75, XIDClassApp, "ROBUST_CHANNEL_CE6_ERROR", "RESTART_APP", "ce6 error", sourceCatalog},
	{76, XIDClassApp, "ROBUST_CHANNEL_CE7_ERROR", "RESTART_APP", "ce7 error", sourceCatalog},
	{77, XIDClassApp, "ROBUST_CHANNEL_CE8_ERROR", "RESTART_APP", "ce8 error", sourceCatalog},
	{78, XIDClassInfo, "VGPU_START_ERROR", "UPDATE_SWFW", "vgpu start error", sourceCatalog},
	{79, XIDClassReboot, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "GPU has fallen off the bus", sourceCatalog},
	{80, XIDClassApp, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP", "pbdma pushbuffer crc mismatch", sourceCatalog},
	{81, XIDClassInfo, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "vga subsystem error", sourceCatalog},
	{82, XIDClassApp, "ROBUST_CHANNEL_NVJPG0_ERROR", "RESTART_APP", "nvjpg0 error", sourceCatalog},
	{83, XIDClassApp, "ROBUST_CHANNEL_NVDEC1_ERROR", "RESTART_APP", "nvdec1 error", sourceCatalog},
	{84, XIDClassApp, "ROBUST_CHANNEL_NVDEC2_ERROR", "RESTART_APP", "nvdec2 error", sourceCatalog},
	{85, XIDClassApp, "ROBUST_CHANNEL_CE9_ERROR", "RESTART_APP", "ce9 error", sourceCatalog},
	{86, XIDClassApp, "ROBUST_CHANNEL_OFA0_ERROR", "RESTART_APP", "ofa0 error", sourceCatalog},
	{87, XIDClassInfo, "NVTELEMETRY_DRIVER_REPORT", "UNEXPECTED_ERR_REPORT_ISSUE", "nvtelemetry driver report", sourceCatalog},
	{88, XIDClassApp, "ROBUST_CHANNEL_NVDEC3_ERROR", "RESTART_APP", "nvdec3 error", sourceCatalog},
	{89, XIDClassApp, "ROBUST_CHANNEL_NVDEC4_ERROR", "RESTART_APP", "nvdec4 error", sourceCatalog},
	{90, XIDClassInfo, "LTC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "ltc error", sourceCatalog},
	{91, XIDClassInfo, "RESERVED_XID", "UNEXPECTED_ERR_REPORT_ISSUE", "reserved xid", sourceCatalog},
	{92, XIDClassInfo, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE", "high single-bit ECC error rate", sourceCatalog},
	{93, XIDClassInfo, "INFOROM_ERASE_LIMIT_EXCEEDED", "IGNORE", "inforom erase limit exceeded", sourceCatalog},
	{94, XIDClassApp, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP", "contained ECC error", sourceCatalog},
	{95, XIDClassReset, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", "uncontained ECC error", sourceCatalog},
	{96, XIDClassApp, "ROBUST_CHANNEL_NVDEC5_ERROR", "RESTART_APP", "nvdec5 error", sourceCatalog},
	{97, XIDClassApp, "ROBUST_CHANNEL_NVDEC6_ERROR", "RESTART_APP", "nvdec6 error", sourceCatalog},
	{98, XIDClassApp, "ROBUST_CHANNEL_NVDEC7_ERROR", "RESTART_APP", "nvdec7 error", sourceCatalog},
	{99, XIDClassApp, "ROBUST_CHANNEL_NVJPG1_ERROR", "RESTART_APP", "nvjpg1 error", sourceCatalog},
	{100, XIDClassApp, "ROBUST_CHANNEL_NVJPG2_ERROR", "RESTART_APP", "nvjpg2 error", sourceCatalog},
	{101, XIDClassApp, "ROBUST_CHANNEL_NVJPG3_ERROR", "RESTART_APP", "nvjpg3 error", sourceCatalog},
	{102, XIDClassApp, "ROBUST_CHANNEL_NVJPG4_ERROR", "RESTART_APP", "nvjpg4 error", sourceCatalog},
	{103, XIDClassApp, "ROBUST_CHANNEL_NVJPG5_ERROR", "RESTART_APP", "nvjpg5 error", sourceCatalog},
	{104, XIDClassApp, "ROBUST_CHANNEL_NVJPG6_ERROR", "RESTART_APP", "nvjpg6 error", sourceCatalog},
	{105, XIDClassApp, "ROBUST_CHANNEL_NVJPG7_ERROR", "RESTART_APP", "nvjpg7 error", sourceCatalog},
	{106, XIDClassInfo, "SMBPBI_TEST_MESSAGE", "IGNORE", "smbpbi test message", sourceCatalog},
	{107, XIDClassInfo, "SMBPBI_TEST_MESSAGE_SILENT", "IGNORE", "smbpbi test message silent", sourceCatalog},
	{108, XIDClassInfo, "DESTINATION_FLA_TRANSLATION_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "destination fla translation error", sourceCatalog},
	{109, XIDClassApp, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU", "context switch timeout", sourceDevicePlugin},
	{110, XIDClassReset, "SEC_FAULT_ERROR", "RESET_GPU", "security fault", sourceCatalog},
	{111, XIDClassInfo, "BUNDLE_ERROR_EVENT", "UNEXPECTED_ERR_REPORT_ISSUE", "bundle error event", sourceCatalog},
	{112, XIDClassInfo, "DISP_SUPERVISOR_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "disp supervisor error", sourceCatalog},
	{113, XIDClassInfo, "DP_LT_FAILURE", "UNEXPECTED_ERR_REPORT_ISSUE", "dp lt failure", sourceCatalog},
	{114, XIDClassInfo, "HEAD_RG_UNDERFLOW", "UNEXPECTED_ERR_REPORT_ISSUE", "head rg underflow", sourceCatalog},
	{115, XIDClassInfo, "CORE_CHANNEL_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", "core channel regs", sourceCatalog},
	{116, XIDClassInfo, "WINDOW_CHANNEL_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", "window channel regs", sourceCatalog},
	{117, XIDClassInfo, "CURSOR_CHANNEL_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", "cursor channel regs", sourceCatalog},
	{118, XIDClassInfo, "HEAD_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", "head regs", sourceCatalog},
	{119, XIDClassReset, "GSP_RPC_TIMEOUT", "RESET_GPU", "GSP RPC timeout", sourceCatalog},
	{120, XIDClassReset, "GSP_ERROR", "RESET_GPU", "GSP error", sourceCatalog},
	{121, XIDClassInfo, "C2C_ERROR", "IGNORE", "C2C link error", sourceCatalog},
	{122, XIDClassInfo, "SPI_PMU_RPC_READ_FAIL", "UNEXPECTED_ERR_REPORT_ISSUE", "spi pmu rpc read fail", sourceCatalog},
	{123, XIDClassInfo, "SPI_PMU_RPC_WRITE_FAIL", "UNEXPECTED_ERR_REPORT_ISSUE", "spi pmu rpc write fail", sourceCatalog},
	{124, XIDClassInfo, "SPI_PMU_RPC_ERASE_FAIL", "UNEXPECTED_ERR_REPORT_ISSUE", "spi pmu rpc erase fail", sourceCatalog},
	{125, XIDClassInfo, "INFOROM_FS_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "inforom fs error", sourceCatalog},
	{126, XIDClassApp, "ROBUST_CHANNEL_CE10_ERROR", "RESTART_APP", "ce10 error", sourceCatalog},
	{127, XIDClassApp, "ROBUST_CHANNEL_CE11_ERROR", "RESTART_APP", "ce11 error", sourceCatalog},
	{128, XIDClassApp, "ROBUST_CHANNEL_CE12_ERROR", "RESTART_APP", "ce12 error", sourceCatalog},
	{129, XIDClassApp, "ROBUST_CHANNEL_CE13_ERROR", "RESTART_APP", "ce13 error", sourceCatalog},
	{130, XIDClassApp, "ROBUST_CHANNEL_CE14_ERROR", "RESTART_APP", "ce14 error", sourceCatalog},
	{131, XIDClassApp, "ROBUST_CHANNEL_CE15_ERROR", "RESTART_APP", "ce15 error", sourceCatalog},
	{132, XIDClassApp, "ROBUST_CHANNEL_CE16_ERROR", "RESTART_APP", "ce16 error", sourceCatalog},
	{133, XIDClassApp, "ROBUST_CHANNEL_CE17_ERROR", "RESTART_APP", "ce17 error", sourceCatalog},
	{134, XIDClassApp, "ROBUST_CHANNEL_CE18_ERROR", "RESTART_APP", "ce18 error", sourceCatalog},
	{135, XIDClassApp, "ROBUST_CHANNEL_CE19_ERROR", "RESTART_APP", "ce19 error", sourceCatalog},
	{136, XIDClassReset, "ALI_TRAINING_FAIL", "RESET_GPU", "link training failure", sourceCatalog},
	{137, XIDClassInfo, "NVLINK_FLA_PRIV_ERR", "IGNORE", "nvlink fla priv err", sourceCatalog},
	{138, XIDClassInfo, "ROBUST_CHANNEL_DLA_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "dla error", sourceCatalog},
	{139, XIDClassApp, "ROBUST_CHANNEL_OFA1_ERROR", "RESTART_APP", "ofa1 error", sourceCatalog},
	{140, XIDClassReset, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU", "unrecoverable ECC error escaped containment", sourceCatalog},
	{141, XIDClassInfo, "ROBUST_CHANNEL_FAST_PATH_ERROR", "IGNORE", "fast path error", sourceCatalog},
	{142, XIDClassInfo, "ROBUST_CHANNEL_NVENC3_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", "nvenc3 error", sourceCatalog},
	{143, XIDClassReset, "GPU_INIT_ERROR", "RESET_GPU", "GPU initialization failure", sourceCatalog},
	{144, XIDClassNVLink, "NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink SAW error", sourceCatalog},
	{145, XIDClassNVLink, "NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink RLW error", sourceCatalog},
	{146, XIDClassNVLink, "NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink TLW error", sourceCatalog},
	{147, XIDClassNVLink, "NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink TREX error", sourceCatalog},
	{148, XIDClassNVLink, "NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink NVLPW control error", sourceCatalog},
	{149, XIDClassNVLink, "NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink NETIR error", sourceCatalog},
	{150, XIDClassNVLink, "NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink MSE error", sourceCatalog},
	{151, XIDClassReboot, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM", "key rotation error (confidential computing)", sourceCatalog},
	{152, XIDClassInfo, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "IGNORE", "dla smmu error", sourceCatalog},
	{153, XIDClassInfo, "ROBUST_CHANNEL_DLA_TIMEOUT", "IGNORE", "dla timeout", sourceCatalog},
	{154, XIDClassInfo, "GPU_RECOVERY_ACTION_CHANGED", "FOLLOW_OTHER_XID", "GPU recovery action changed", sourceCatalog},
	{155, XIDClassReset, "NVLINK_SW_DEFINED_ERROR", "RESET_GPU", "NVLink software-defined error", sourceCatalog},
	{156, XIDClassReset, "RESOURCE_RETIREMENT_EVENT", "RESET_GPU", "resource retirement event", sourceCatalog},
	{157, XIDClassInfo, "RESOURCE_RETIREMENT_FAILURE", "IGNORE", "resource retirement failure", sourceCatalog},
	{158, XIDClassReset, "GPU_FATAL_TIMEOUT", "RESET_GPU", "GPU fatal timeout", sourceCatalog},
	{159, XIDClassInfo, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM", "CHI non-data error", sourceCatalog},
	{160, XIDClassReboot, "CHANNEL_RETIREMENT_EVENT", "RESTART_BM", "channel retirement event", sourceCatalog},
	{161, XIDClassInfo, "CHANNEL_RETIREMENT_FAILURE", "IGNORE", "channel retirement failure", sourceCatalog},
	{162, XIDClassReset, "-", "RESET_GPU", "no mnemonic in the catalog", sourceCatalog},
}

// XIDTable returns the XID table, sorted by XID (a copy: callers may keep
// or change it). docs/xids.md is generated from it.
func XIDTable() []XIDEntry { return slices.Clone(xidTable) }

// ClassifyXID returns the class of XID x; XIDs the table does not know
// are XIDClassInfo (counted only), as the catalog says nothing of them.
func ClassifyXID(x uint64) XIDClass {
	i, ok := slices.BinarySearchFunc(xidTable, x, func(e XIDEntry, x uint64) int {
		switch {
		case e.XID < x:
			return -1
		case e.XID > x:
			return 1
		}
		return 0
	})
	if !ok {
		return XIDClassInfo
	}
	return xidTable[i].Class
}
