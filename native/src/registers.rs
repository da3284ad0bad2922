//! `linearize bench registers`: what the GPU's own compiler makes of our kernels — registers per
//! thread, workgroup memory, code size — through Vulkan's VK_KHR_pipeline_executable_properties.
//! A kernel's occupancy follows from its registers (an NVIDIA SM holds 65,536: a workgroup of 256
//! threads above 128 registers each runs alone there) and its workgroup memory (NVIDIA's Vulkan
//! driver gives an SM's resident workgroups 48 KiB in all, BENCHMARKS.md, session 59), and no
//! timing shows that directly: each kernel's line says how many workgroups an SM holds by each.
//! Each kernel is built as wgpu would build it: naga's SPIR-V of our WGSL with the
//! override constants applied, loop bounding and wgpu's bounds checks, on a Vulkan device of its
//! own (wgpu asks for no statistics). Native only; the adapter must offer the extension (NVIDIA,
//! AMD and Intel drivers do; lavapipe does not).
use anyhow::{anyhow, bail, Context, Result};
use ash::vk;
use linearize_core::gpu::Kernel;
use serde_json::{json, Value};
use std::ffi::{CStr, CString};

/// One pipeline to build: a shader of the binary (`nn/matvec`) or a WGSL file, its entry
/// point, and its override constants.
pub struct KernelSpec {
    pub shader: String,
    pub entry: String,
    pub constants: Vec<(String, f64)>,
}

impl From<Kernel> for KernelSpec {
    fn from(k: Kernel) -> Self {
        KernelSpec { shader: k.shader.into(), entry: k.entry.into(), constants: k.constants.iter().map(|(n, v)| (n.to_string(), *v)).collect() }
    }
}

/// The kernels whose occupancy decides the training step and decode (BENCHMARKS.md): every
/// rule's chunked recurrence at head size 64 with the constants its layer runs them with,
/// gated DeltaNet's backward at 128 (its products on tensor cores), decode's products, split
/// attention and recurrent step.
pub fn default_kernels() -> Vec<KernelSpec> {
    use linearize_core::mixers::recurrence::chunk_constants;
    use linearize_core::mixers::{MixerKind, MixerOptions};
    let mut out: Vec<KernelSpec> = Vec::new();
    for kind in MixerKind::all() {
        let r = kind.recurrence(&MixerOptions::default());
        for entry in ["chunk_prepare", "chunk_state", "chunk_output", "chunk_bwd_local", "chunk_bwd_state", "chunk_bwd_grads"] {
            out.push(chunk_constants(r, Kernel::new("mixers/common/chunk", entry)).into());
        }
    }
    let gdn = MixerKind::from_name("gated_deltanet").expect("a registered mixer").recurrence(&MixerOptions::default());
    out.push(chunk_constants(gdn, Kernel::new("mixers/common/chunk_d128", "chunk_bwd_grads")).with("PRODUCTS_DONE", 1.0).into());
    // Head size 128 on tensor cores, with the constants the recurrence dispatches them with:
    // gated DeltaNet's kernels (RetNet's for the additive rules' sweep, which writes the
    // output's operands), the linear layers' GEMM and the prefill attention.
    use linearize_core::mixers::recurrence::{coop_kernel, sweep_kernel};
    let retnet = MixerKind::from_name("retnet").expect("a registered mixer").recurrence(&MixerOptions::default());
    out.push(sweep_kernel(retnet, "chunk_sweep_operands").with("OUT16", 1.0).into());
    for entry in ["chunk_prepare_coop", "chunk_state_coop", "chunk_bwd_sweep_operands", "chunk_bwd_local_coop", "chunk_bwd_state_coop", "chunk_bwd_scores_coop", "chunk_bwd_wy_coop"] {
        out.push(sweep_kernel(gdn, entry).into());
    }
    out.push(coop_kernel(gdn, "chunk_operands").with("SWEEP_WROTE", 1.0).into());
    for entry in ["chunk_output_coop", "chunk_bwd_states16"] {
        out.push(coop_kernel(gdn, entry).into());
    }
    out.push(coop_kernel(gdn, "chunk_bwd_products").with("DELTA", gdn.delta as u8 as f64).into());
    for entry in ["operand_amax", "operand_f16", "matmul_coop", "sum_splits"] {
        out.push(Kernel::new("native/matmul_coop", entry).into());
    }
    out.push(Kernel::new("native/attention_coop", "attention_coop").into());
    for prologue in [0.0, 1.0, 2.0, 3.0, 4.0] {
        out.push(Kernel::new("nn/matvec", "matvec").with("PROLOGUE", prologue).with("LANES", 64.0).into());
    }
    out.push(Kernel::new("nn/attention", "attention_decode_split_rope").into());
    out.push(Kernel::new("mixers/common/recurrent", "recurrent_k64").into());
    out
}

/// `NAME=VALUE,…` as override constants.
pub fn parse_constants(text: &str) -> Result<Vec<(String, f64)>> {
    text.split(',').filter(|s| !s.is_empty()).map(|pair| {
        let (name, value) = pair.split_once('=').ok_or_else(|| anyhow!("invalid argument --constants: expected NAME=VALUE, got '{pair}'"))?;
        let value = value.parse::<f64>().map_err(|_| anyhow!("invalid argument --constants: '{value}' (for {name}) is not a number"))?;
        Ok((name.to_string(), value))
    }).collect()
}

/// The WGSL of `shader`: a file when it ends in .wgsl, else one of the binary's shaders.
fn wgsl(shader: &str) -> Result<String> {
    if shader.ends_with(".wgsl") {
        return std::fs::read_to_string(shader).with_context(|| format!("reading shader {shader}"));
    }
    linearize_core::shaders::source(shader).map(str::to_string).ok_or_else(|| anyhow!("invalid argument --shader: no shader '{shader}' (a name under shaders/ such as nn/matvec, or a .wgsl file)"))
}

/// `k`'s shader parsed, its entry point checked: what the device builds, found wrong before
/// any device is opened.
fn parsed(k: &KernelSpec) -> Result<naga::Module> {
    let src = wgsl(&k.shader)?;
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| anyhow!("{}: {}", k.shader, e.emit_to_string(&src)))?;
    if !module.entry_points.iter().any(|e| e.name == k.entry) {
        bail!("invalid argument --entry: {} has no entry point '{}'", k.shader, k.entry);
    }
    Ok(module)
}

/// Group 0's (binding, descriptor type) pairs.
type Bindings = Vec<(u32, vk::DescriptorType)>;

/// SPIR-V of one entry point with its constants, as wgpu-hal's Vulkan backend writes it, and
/// its shader's bindings.
fn spirv(module: &naga::Module, k: &KernelSpec, lang: (u8, u8)) -> Result<(Vec<u32>, Bindings)> {
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all()).validate(module).map_err(|e| anyhow!("{}: {e:?}", k.shader))?;
    let constants = k.constants.iter().cloned().collect();
    let (module, info) = naga::back::pipeline_constants::process_overrides(module, &info, Some((naga::ShaderStage::Compute, &k.entry)), &constants).map_err(|e| anyhow!("{}::{}: {e}", k.shader, k.entry))?;
    use naga::proc::BoundsCheckPolicy::{Restrict, Unchecked};
    let options = naga::back::spv::Options {
        lang_version: lang,
        bounds_check_policies: naga::proc::BoundsCheckPolicies { index: Restrict, buffer: Unchecked, image_load: Unchecked, binding_array: Unchecked },
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::Native,
        force_loop_bounding: true,
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: k.entry.clone() };
    let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline)).map_err(|e| anyhow!("{}::{}: {e}", k.shader, k.entry))?;
    let bindings = module.global_variables.iter().filter_map(|(_, v)| {
        let b = v.binding.as_ref()?;
        let ty = match v.space {
            naga::AddressSpace::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
            naga::AddressSpace::Storage { .. } => vk::DescriptorType::STORAGE_BUFFER,
            _ => return None,
        };
        Some((b.binding, ty))
    });
    Ok((words, bindings.collect()))
}

/// A Vulkan device with pipeline statistics on the first discrete GPU (else the first adapter).
struct StatsDevice {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    ext: ash::khr::pipeline_executable_properties::Device,
    adapter: String,
    lang: (u8, u8),
}

impl StatsDevice {
    fn new() -> Result<Self> {
        unsafe {
            let entry = ash::Entry::load().context("loading the Vulkan loader (libvulkan)")?;
            let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_2);
            let instance = entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None).context("creating a Vulkan instance")?;
            let devices = instance.enumerate_physical_devices()?;
            let pick = devices.iter().copied().find(|&p| instance.get_physical_device_properties(p).device_type == vk::PhysicalDeviceType::DISCRETE_GPU).or(devices.first().copied());
            let physical = pick.ok_or_else(|| anyhow!("no Vulkan adapter"))?;
            let props = instance.get_physical_device_properties(physical);
            let adapter = CStr::from_ptr(props.device_name.as_ptr()).to_string_lossy().to_string();
            let minor = vk::api_version_minor(props.api_version);
            let lang = if minor >= 3 { (1, 6) } else if minor == 2 { (1, 5) } else { (1, 3) };
            let want = ash::khr::pipeline_executable_properties::NAME;
            let has = instance.enumerate_device_extension_properties(physical)?.iter().any(|e| CStr::from_ptr(e.extension_name.as_ptr()) == want);
            if !has {
                bail!("adapter '{adapter}' does not offer VK_KHR_pipeline_executable_properties, which `bench registers` reads (NVIDIA, AMD and Intel drivers do; lavapipe does not)");
            }
            let family = instance.get_physical_device_queue_family_properties(physical).iter().position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE)).ok_or_else(|| anyhow!("adapter '{adapter}' has no compute queue"))? as u32;
            let priority = [1.0f32];
            let queues = [vk::DeviceQueueCreateInfo::default().queue_family_index(family).queue_priorities(&priority)];
            let mut stats = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default().pipeline_executable_info(true);
            let names = [want.as_ptr()];
            let info = vk::DeviceCreateInfo::default().queue_create_infos(&queues).enabled_extension_names(&names).push_next(&mut stats);
            let device = instance.create_device(physical, &info, None).context("creating a Vulkan device with pipeline statistics")?;
            let ext = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
            Ok(StatsDevice { _entry: entry, instance, device, ext, adapter, lang })
        }
    }

    /// The driver's statistics of `k`'s pipeline, as (name, value) pairs.
    fn statistics(&self, k: &KernelSpec, module: &naga::Module) -> Result<Vec<(String, Value)>> {
        let (words, bindings) = spirv(module, k, self.lang)?;
        unsafe {
            let d = &self.device;
            let module = d.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)?;
            let layout_bindings: Vec<_> = bindings.iter().map(|&(b, ty)| vk::DescriptorSetLayoutBinding::default().binding(b).descriptor_type(ty).descriptor_count(1).stage_flags(vk::ShaderStageFlags::COMPUTE)).collect();
            let set = d.create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&layout_bindings), None)?;
            let sets = [set];
            let layout = d.create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().set_layouts(&sets), None)?;
            let name = CString::new(k.entry.as_str())?;
            let stage = vk::PipelineShaderStageCreateInfo::default().stage(vk::ShaderStageFlags::COMPUTE).module(module).name(&name);
            let info = vk::ComputePipelineCreateInfo::default().stage(stage).layout(layout).flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR);
            let made = d.create_compute_pipelines(vk::PipelineCache::null(), &[info], None);
            let result = match made {
                Ok(p) => {
                    let out = self.read(p[0]);
                    d.destroy_pipeline(p[0], None);
                    out
                }
                Err((_, e)) => Err(anyhow!("{}::{}: the driver could not build it ({e}); shaders that need cooperative matrices or f16 are not supported here", k.shader, k.entry)),
            };
            d.destroy_pipeline_layout(layout, None);
            d.destroy_descriptor_set_layout(set, None);
            d.destroy_shader_module(module, None);
            result
        }
    }

    unsafe fn read(&self, pipeline: vk::Pipeline) -> Result<Vec<(String, Value)>> {
        let mut out = Vec::new();
        let executables = self.ext.get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline))?;
        for i in 0..executables.len() as u32 {
            for s in self.ext.get_pipeline_executable_statistics(&vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(i))? {
                let name = CStr::from_ptr(s.name.as_ptr()).to_string_lossy().to_string();
                let value = match s.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => json!(s.value.b32 != 0),
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => json!(s.value.i64),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => json!(s.value.u64),
                    _ => json!(s.value.f64),
                };
                out.push((name, value));
            }
        }
        Ok(out)
    }
}

impl Drop for StatsDevice {
    fn drop(&mut self) {
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

/// What an NVIDIA SM gives its resident workgroups: 65,536 registers (in four quarters of
/// 16,384, each warp's taken in blocks of 256: its threads' count rounded up to 8), 48 KiB of
/// workgroup memory under Vulkan (measured: two workgroups of 24,064 bytes run side by side, two
/// of 24,832 do not, BENCHMARKS.md session 59), 64 warps and 32 workgroups.
const SM_REGISTER_QUARTER: u64 = 16_384;
const SM_WORKGROUP_MEMORY: u64 = 48 * 1024;
const SM_WARPS: u64 = 64;
const SM_WORKGROUPS: u64 = 32;

/// How many workgroups of `threads` threads, `registers` registers each and `memory` bytes of
/// workgroup memory an NVIDIA SM holds at once, by each of its limits: (registers, workgroup
/// memory, threads), the least of them the one that binds.
pub fn workgroups_per_sm(threads: u64, registers: u64, memory: u64) -> (u64, u64, u64) {
    let warps = threads.div_ceil(32).max(1);
    let per_warp = registers.div_ceil(8) * 8 * 32;
    let by_registers = if per_warp == 0 { SM_WORKGROUPS } else { 4 * (SM_REGISTER_QUARTER / per_warp) / warps };
    let by_memory = if memory == 0 { SM_WORKGROUPS } else { SM_WORKGROUP_MEMORY / memory };
    let by_threads = (SM_WARPS / warps).min(SM_WORKGROUPS);
    (by_registers.min(SM_WORKGROUPS), by_memory.min(SM_WORKGROUPS), by_threads)
}

/// Threads per workgroup of `entry` (its @workgroup_size, overrides applied as none are used there).
fn threads(module: &naga::Module, entry: &str) -> u64 {
    module.entry_points.iter().find(|e| e.name == entry).map_or(0, |e| e.workgroup_size.iter().map(|&n| n as u64).product())
}

/// A pipeline statistic by name, where the driver reports it as an integer.
fn stat(stats: &[(String, Value)], name: &str) -> Option<u64> {
    stats.iter().find(|(n, _)| n == name).and_then(|(_, v)| v.as_u64())
}

/// NVIDIA's statistics of a pipeline, by name: registers per thread and workgroup memory in bytes.
fn nvidia_usage(stats: &[(String, Value)]) -> Option<(u64, u64)> {
    Some((stat(stats, "Register Count")?, stat(stats, "Shared Memory Size")?))
}

/// Local memory in bytes a thread from NVIDIA's "Local Memory Size", which its driver (580)
/// reports with bit 36 set on every pipeline: the low 32 bits are the bytes. Anything above zero
/// is a spill or an array the compiler could not keep in registers (indexed in a loop, even a
/// constant one), read and written through the cache: slow in a hot loop (BENCHMARKS.md,
/// session 65: the prefill attention's arrays cost it half its speed).
pub fn local_memory_bytes(reported: u64) -> u64 {
    reported & 0xffff_ffff
}

/// Each kernel's statistics, one JSON object per kernel (also printed a line each).
pub fn bench_registers(kernels: &[KernelSpec]) -> Result<(String, Vec<Value>)> {
    // Every named shader and entry point checked before any device is opened.
    let modules = kernels.iter().map(parsed).collect::<Result<Vec<_>>>()?;
    let dev = StatsDevice::new()?;
    eprintln!("adapter: {} (Vulkan, pipeline statistics)", dev.adapter);
    let mut out = Vec::new();
    for (k, module) in kernels.iter().zip(&modules) {
        let constants: Vec<String> = k.constants.iter().map(|(n, v)| format!("{n}={v}")).collect();
        // A kernel the driver cannot build is reported and the rest still measured.
        let stats = match dev.statistics(k, module) {
            Ok(stats) => stats,
            Err(e) => {
                eprintln!("{}::{} [{}]: {e:#}", k.shader, k.entry, constants.join(","));
                out.push(json!({"what": "kernel", "shader": k.shader, "entry": k.entry, "constants": constants, "error": format!("{e:#}")}));
                continue;
            }
        };
        let mut line: Vec<String> = stats.iter().map(|(n, v)| format!("{n} {v}")).collect();
        let threads = threads(module, &k.entry);
        let mut record = json!({"what": "kernel", "shader": k.shader, "entry": k.entry, "constants": constants, "threads": threads});
        if let Some((registers, memory)) = nvidia_usage(&stats) {
            let (by_registers, by_memory, by_threads) = workgroups_per_sm(threads, registers, memory);
            line.push(format!("{threads} threads: workgroups per SM {} (registers {by_registers}, workgroup memory {by_memory}, threads {by_threads})", by_registers.min(by_memory).min(by_threads)));
            record["workgroups_per_sm"] = json!({"registers": by_registers, "workgroup_memory": by_memory, "threads": by_threads});
        }
        if let Some(local) = stat(&stats, "Local Memory Size").map(local_memory_bytes).filter(|&b| b > 0) {
            line.push(format!("LOCAL MEMORY {local} bytes a thread (spills or arrays not in registers)"));
            record["local_memory_bytes"] = json!(local);
        }
        eprintln!("{}::{} [{}]: {}", k.shader, k.entry, constants.join(","), line.join(", "));
        record["statistics"] = Value::Object(stats.into_iter().collect());
        out.push(record);
    }
    if !out.is_empty() && out.iter().all(|r| r.get("error").is_some()) {
        bail!("the driver of '{}' built none of the {} kernels (the first: {})", dev.adapter, out.len(), out[0]["error"]);
    }
    Ok((dev.adapter.clone(), out))
}

#[cfg(test)]
mod tests {
    use super::{local_memory_bytes, workgroups_per_sm};

    #[test]
    fn local_memory_is_the_low_word_of_nvidias_figure() {
        // As the H100's driver reported them (session 65): none, main's attention, a32's.
        assert_eq!(local_memory_bytes(68_719_476_736), 0);
        assert_eq!(local_memory_bytes(68_719_476_864), 128);
        assert_eq!(local_memory_bytes(68_719_476_928), 192);
        assert_eq!(local_memory_bytes(80), 80);
    }

    /// The session-59 probe's kernels on the H100: what ran side by side is what this counts.
    #[test]
    fn workgroups_per_sm_matches_the_measured_probe() {
        // chunk_output_coop: 128 threads, 167 registers, 13,568 bytes: three by both.
        assert_eq!(workgroups_per_sm(128, 167, 13_568), (3, 3, 16));
        // With 11 KiB more (and 253 registers): two by registers, one by memory.
        assert_eq!(workgroups_per_sm(128, 253, 24_832), (2, 1, 16));
        // chunk_prepare_coop: 256 threads, 112 registers, 24,064 bytes: two; 4 KiB more, one.
        assert_eq!(workgroups_per_sm(256, 112, 24_064), (2, 2, 8));
        assert_eq!(workgroups_per_sm(256, 116, 28_160).1, 1);
        // Above 128 registers a 256-thread workgroup runs alone; no workgroup memory, no limit.
        assert_eq!(workgroups_per_sm(256, 129, 0), (1, 32, 8));
        // A lone subgroup: the SM's 32 workgroups bind.
        assert_eq!(workgroups_per_sm(32, 64, 1_024), (32, 32, 32));
    }
}
