//! Every shader parses and validates with naga, with no optional capability beyond core WGSL:
//! what passes here needs nothing a WebGPU browser may lack.
use linearize_core::shaders::ALL;

#[test]
fn every_shader_validates_without_native_features() {
    assert!(!ALL.is_empty());
    for (name, source) in ALL {
        let module = naga::front::wgsl::parse_str(source).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
        // unpack2x16float (packed f16 weights) is core WGSL; naga files it under a capability
        // only because some native downlevel backends lack it. Nothing else is allowed.
        let core_wgsl = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
        let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), core_wgsl);
        v.validate(&module).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(source)));
        assert!(module.entry_points.iter().all(|e| e.stage == naga::ShaderStage::Compute), "{name}: compute only");
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
