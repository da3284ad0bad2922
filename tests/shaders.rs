//! Every shader parses and validates with naga, with no optional capability beyond core WGSL
//! (what passes needs nothing a WebGPU browser may lack), except the native/ ones, which may use
//! cooperative matrices and f16 and nothing more.
use linearize_core::gpu::Scalar;
use linearize_core::shaders::{is_native_only, ALL, PARAMS};

#[test]
fn every_shader_validates_with_only_what_its_targets_offer() {
    assert!(!ALL.is_empty());
    for (name, source) in ALL {
        let module = naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
        // unpack2x16float (packed f16 weights) is core WGSL; naga files it under a capability
        // only because some native downlevel backends lack it. Nothing else is allowed.
        let mut caps = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
        if is_native_only(name) {
            caps |= naga::valid::Capabilities::COOPERATIVE_MATRIX | naga::valid::Capabilities::SHADER_FLOAT16;
        }
        let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
        let info = v.validate(&module).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
        if is_native_only(name) {
            // What wgpu's Vulkan backend does with it: naga's SPIR-V writer has panicked on
            // cooperative-matrix code it validated (../shared/PERF.md), so write it here too.
            // With overrides, for every combination of the values the runtime gives them.
            let options = naga::back::spv::Options { lang_version: (1, 6), ..Default::default() };
            for constants in override_combinations(&module) {
                let (module, info) = naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants).unwrap_or_else(|e| panic!("{name} with {constants:?}: {e}"));
                naga::back::spv::write_vec(&module, &info, &options, None).unwrap_or_else(|e| panic!("{name} with {constants:?}: SPIR-V: {e}"));
            }
        }
        assert!(module.entry_points.iter().all(|e| e.stage == naga::ShaderStage::Compute), "{name}: compute only");
    }
}

/// Every native/ shader with its cooperative matrices emulated (gpu/coop_emulation.rs, the path
/// of adapters with f16 but no cooperative matrices, lavapipe in CI) validates with f16 alone and
/// writes SPIR-V, for every combination of its overrides.
#[test]
fn every_native_shader_validates_emulated() {
    let mut seen = 0;
    for (name, source) in ALL.iter().filter(|(n, _)| is_native_only(n)) {
        let text = linearize_core::gpu::coop_emulation::emulate(source).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!text.contains("coop_mat16x16") && !text.contains("coopMultiplyAdd"), "{name}: cooperative matrices left");
        let module = naga::front::wgsl::parse_str(&text).unwrap_or_else(|e| panic!("{name} emulated: {}", e.emit_to_string(&text)));
        let caps = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32 | naga::valid::Capabilities::SHADER_FLOAT16;
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps).validate(&module).unwrap_or_else(|e| panic!("{name} emulated: {}", e.emit_to_string(&text)));
        let options = naga::back::spv::Options { lang_version: (1, 6), ..Default::default() };
        for constants in override_combinations(&module) {
            let (module, info) = naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants).unwrap_or_else(|e| panic!("{name} emulated with {constants:?}: {e}"));
            naga::back::spv::write_vec(&module, &info, &options, None).unwrap_or_else(|e| panic!("{name} emulated with {constants:?}: SPIR-V: {e}"));
        }
        seen += 1;
    }
    assert!(seen >= 4, "the native shaders were not found");
}

/// The override constants over the values the runtime gives them (GATE 0–2, DELTA, NORM and
/// PRODUCTS_DONE, SWEEP_WROTE and OUT16 as recurrence.rs sets them, A_T and B_T as nn::coop does,
/// MAXIMA as nn::attention does); one empty set for a shader without overrides.
fn override_combinations(module: &naga::Module) -> Vec<naga::back::PipelineConstants> {
    let values = |name: &str| -> Vec<f64> {
        match name {
            "GATE" | "NORM" => vec![0.0, 1.0, 2.0],
            "DELTA" | "PRODUCTS_DONE" | "SWEEP_WROTE" | "OUT16" | "A_T" | "B_T" | "MAXIMA" => vec![0.0, 1.0],
            other => panic!("override {other}: the test does not know its values"),
        }
    };
    let mut all = vec![naga::back::PipelineConstants::default()];
    for (_, o) in module.overrides.iter() {
        let name = o.name.clone().expect("named overrides");
        let mut next = Vec::new();
        for c in &all {
            for v in values(&name) {
                let mut c = c.clone();
                c.insert(name.clone(), v);
                next.push(c);
            }
        }
        all = next;
    }
    all
}

/// Each shader's `struct Params` as naga reads it: field names, scalar kinds and size in bytes.
fn wgsl_params(name: &str, source: &str) -> Option<(Vec<(String, Scalar)>, usize)> {
    let module = naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
    let (_, ty) = module.types.iter().find(|(_, t)| t.name.as_deref() == Some("Params"))?;
    let naga::TypeInner::Struct { members, span } = &ty.inner else { panic!("{name}: Params is not a struct") };
    let fields = members
        .iter()
        .map(|m| {
            let scalar = match module.types[m.ty].inner {
                naga::TypeInner::Scalar(naga::Scalar { kind: naga::ScalarKind::Uint, width: 4 }) => Scalar::U32,
                naga::TypeInner::Scalar(naga::Scalar { kind: naga::ScalarKind::Float, width: 4 }) => Scalar::F32,
                ref other => panic!("{name}: Params.{} is {other:?}; parameter blocks hold u32 and f32", m.name.as_deref().unwrap_or("?")),
            };
            (m.name.clone().unwrap_or_default(), scalar)
        })
        .collect();
    Some((fields, *span as usize))
}

/// Every shader's uniform `struct Params` has a Rust twin in linearize_core::shaders with the
/// same fields in the same order, of the same kinds and size, and every twin names real shaders.
#[test]
fn every_params_struct_matches_its_shader() {
    for (name, source) in ALL {
        let Some((fields, span)) = wgsl_params(name, source) else { continue };
        let twins: Vec<_> = PARAMS.iter().filter(|p| p.shaders.contains(name)).collect();
        assert_eq!(twins.len(), 1, "{name}: struct Params needs exactly one Rust twin in linearize_core::shaders, found {}", twins.len());
        let twin = twins[0];
        let rust: Vec<(String, Scalar)> = twin.fields.iter().map(|(n, s)| (n.to_string(), *s)).collect();
        assert_eq!(rust, fields, "{name}: {} differs from the shader's struct Params", twin.rust_name);
        assert_eq!(twin.size, span, "{name}: {} is {} bytes, the shader's Params {span}", twin.rust_name, twin.size);
    }
    for p in PARAMS {
        for shader in p.shaders {
            let source = ALL.iter().find(|(n, _)| n == shader).unwrap_or_else(|| panic!("{} names {shader}, which is not a shader", p.rust_name)).1;
            assert!(wgsl_params(shader, source).is_some(), "{} names {shader}, which has no struct Params", p.rust_name);
        }
    }
}

#[test]
fn every_shader_file_is_registered() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders");
    let mut files = Vec::new();
    fn walk(d: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "wgsl") {
                out.push(p.strip_prefix(root).unwrap().with_extension("").to_string_lossy().replace('\\', "/"));
            }
        }
    }
    walk(&dir, &dir, &mut files);
    for f in files {
        assert!(ALL.iter().any(|(n, _)| *n == f), "shaders/{f}.wgsl is not in linearize_core::shaders::ALL");
    }
}

/// The generated shaders are what their generators write: each shaders/gen/*.py runs on a copy
/// of shaders/ and every file it writes must equal the committed one.
#[test]
fn generated_shaders_match_their_generators() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders");
    let copy = linearize_tests::tempdir("shaders-gen").join("shaders");
    fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let p = e.unwrap().path();
            let target = to.join(p.file_name().unwrap());
            if p.is_dir() {
                copy_dir(&p, &target);
            } else {
                std::fs::copy(&p, &target).unwrap();
            }
        }
    }
    copy_dir(&root, &copy);
    let mut generators: Vec<_> = std::fs::read_dir(copy.join("gen")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "py")).collect();
    generators.sort();
    assert!(!generators.is_empty());
    let wgsl = |dir: &std::path::Path| -> Vec<(std::path::PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        fn walk(d: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "wgsl") {
                    out.push(p);
                }
            }
        }
        let mut files = Vec::new();
        walk(dir, &mut files);
        for f in files {
            out.push((f.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&f).unwrap()));
        }
        out.sort();
        out
    };
    // The committed files, then the same files after every generator has written over its own.
    let before = wgsl(&copy);
    for g in &generators {
        let o = std::process::Command::new("python3").arg(g).output().expect("python3 runs the shader generators");
        assert!(o.status.success(), "{}: {}", g.display(), String::from_utf8_lossy(&o.stderr));
    }
    let after = wgsl(&copy);
    assert_eq!(before.len(), after.len());
    for ((path, committed), (_, generated)) in before.iter().zip(&after) {
        assert!(committed == generated, "shaders/{} differs from what shaders/gen writes; run the generator and commit its output", path.display());
    }
    std::fs::remove_dir_all(copy.parent().unwrap()).unwrap();
}

/// What the runtime reads of each shader's bindings to build its bind group layouts
/// (linearize_core::gpu::declared_storage: binding number → read-only) is what naga reads: every
/// storage binding with its access, binding 0 the uniform parameters, nothing else in group 0.
#[test]
fn every_shader_declares_its_bindings_as_the_layouts_read_them() {
    for (name, source) in ALL {
        let module = naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
        let mut want = std::collections::HashMap::new();
        for (_, var) in module.global_variables.iter() {
            let Some(binding) = &var.binding else { continue };
            assert_eq!(binding.group, 0, "{name}: {:?} is outside group 0", var.name);
            match var.space {
                naga::AddressSpace::Uniform => assert_eq!(binding.binding, 0, "{name}: a uniform other than binding 0"),
                naga::AddressSpace::Storage { access } => {
                    want.insert(binding.binding, !access.contains(naga::StorageAccess::STORE));
                }
                ref other => panic!("{name}: binding {} in {other:?}", binding.binding),
            }
        }
        assert_eq!(linearize_core::gpu::declared_storage(source), want, "{name}");
    }
}

/// Constants a shader and its launcher both use, equal in both: conv.wgsl's TILE_T sizes the
/// grid and the partial sums that mixers::ops::short_conv_backward allocates.
#[test]
fn constants_shared_with_the_host_agree() {
    let (_, conv) = ALL.iter().find(|(name, _)| *name == "mixers/common/conv").expect("conv.wgsl registered");
    let tile: usize = conv
        .lines()
        .find_map(|l| l.trim().strip_prefix("const TILE_T: u32 = ")?.strip_suffix("u;")?.parse().ok())
        .expect("conv.wgsl declares const TILE_T: u32 = Nu;");
    assert_eq!(tile, linearize_core::mixers::ops::CONV_BACKWARD_TILE);
    // The CPU products' block: the host sizes their grids from these.
    let (_, vec4) = ALL.iter().find(|(name, _)| *name == "nn/matmul_vec4").expect("matmul_vec4.wgsl registered");
    for (name, host) in [("MV_COLS", linearize_core::nn::MV_COLS), ("MV_ROWS", linearize_core::nn::MV_ROWS), ("MV_BLOCK_COLS", linearize_core::nn::MV_BLOCK_COLS)] {
        let wgsl: usize = vec4
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("const {name}: u32 = "))?.strip_suffix("u;")?.parse().ok())
            .unwrap_or_else(|| panic!("matmul_vec4.wgsl declares const {name}: u32 = Nu;"));
        assert_eq!(wgsl, host, "{name}");
    }
    let threads = linearize_core::nn::COLUMN_THREADS;
    for entry in ["matvec_columns", "matmul_columns"] {
        assert!(vec4.contains(&format!("@compute @workgroup_size({threads})\nfn {entry}(")), "{entry} runs {threads} threads, as nn::linear_block's grid assumes");
    }
}

/// Every workgroup variable of a native/ shader is a multiple of 16 bytes. Cooperative-matrix
/// loads and stores need 16-byte aligned rows, and the driver places workgroup variables one
/// after another at their own alignment: a 4-byte variable among the tiles misaligned the ones
/// after it and gave wrong products on the H100 while the emulation passed (BENCHMARKS.md,
/// session 65).
#[test]
fn native_workgroup_variables_keep_16_byte_alignment() {
    let mut seen = 0;
    for (name, source) in ALL.iter().filter(|(n, _)| is_native_only(n)) {
        let module = naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).unwrap();
        let mut total = 0;
        for (_, var) in module.global_variables.iter().filter(|(_, v)| v.space == naga::AddressSpace::WorkGroup) {
            let size = layouter[var.ty].size;
            assert!(size % 16 == 0, "{name}: workgroup variable `{}` is {size} bytes, not a multiple of 16", var.name.as_deref().unwrap_or("?"));
            total += size;
        }
        if *name == "native/attention_coop" {
            // The host picks the kernel by this size against the adapter's limit.
            assert_eq!(total, linearize_core::nn::ATTENTION_COOP_WORKGROUP_BYTES, "{name}'s workgroup memory");
        }
        seen += 1;
    }
    assert!(seen >= 4, "the native shaders were not found");
}
