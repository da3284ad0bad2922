//! Cooperative matrices emulated in plain WGSL, so that the tensor-core kernels (shaders/native/)
//! run where the adapter has f16 but no cooperative matrices — lavapipe in CI — with their own
//! indexing, masks, scales and barriers. Only the arithmetic is not the tensor cores': each
//! product is summed in f32 in a fixed order, from the same f16 operands.
//!
//! The kernels use a small vocabulary, which this rewrites textually (`emulate`):
//! - `coop_mat16x16<f32, C>` becomes `CoopC`, a thread's eight elements of the accumulator as a
//!   `mat2x4<f32>` (so that `+` and `* scalar` still apply): thread `lane` of its subgroup (the
//!   kernels take subgroup s as threads 32s .. 32s + 31) holds row lane / 2, columns
//!   8 (lane % 2) .. + 7;
//! - `coop_mat16x16<f16, A>` and `<f16, B>` become `CoopA` and `CoopB`, held the same way, their
//!   values rounded to f16;
//! - `coopLoad` (column-major: element (r, c) at r + c·stride) and `coopLoadT` (row-major: at
//!   r·stride + c) of `&array[i]`, and `coopStore` / `coopStoreT`, become calls of functions
//!   written here for each array used, with the row and column strides as arguments;
//! - `coopMultiplyAdd(a, b, c)` becomes `coop_mma`: each thread puts its elements of a and b
//!   in its subgroup's part of a workgroup array (`coop_ab`, 1 KiB per subgroup), and after a
//!   barrier sums its eight outputs from there; a second barrier frees the array. The kernels
//!   keep cooperative-matrix operations in uniform control flow, so the barriers are too.
//! Each entry point first keeps its `local_invocation_index`, which gives the thread's subgroup
//! and lane.
//! (Holding whole operands in every thread instead, lavapipe's compiler took minutes a kernel.)

/// `source` (a shader of shaders/native/) with its cooperative matrices emulated; an error names
/// what the rewrite does not know.
pub fn emulate(source: &str) -> Result<String, String> {
    let arrays = declared_arrays(source);
    let mut used: Vec<(Kind, String)> = Vec::new();
    let mut out = String::with_capacity(source.len() + 4096);
    let mut rest = source;
    while let Some((at, call)) = next_call(rest) {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let (kind, transposed) = match call {
            Call::Access { kind, transposed } => (kind, transposed),
            Call::MultiplyAdd => {
                out.push_str("coop_mma");
                rest = &rest["coopMultiplyAdd".len()..];
                continue;
            }
        };
        // A load's arguments follow its type parameter, a store's its name.
        let open = match kind {
            Kind::Load(_) => {
                let lt = rest.find('<').unwrap();
                let close = matching(rest, lt, '<', '>').ok_or("an unclosed type in a coopLoad")?;
                let ty = &rest[lt + 1..close];
                if !["coop_mat16x16<f32, C>", "coop_mat16x16<f16, A>", "coop_mat16x16<f16, B>"].contains(&ty) {
                    return Err(format!("a load of `{ty}`, which the emulation does not know"));
                }
                close + 1
            }
            Kind::Store => rest.find('(').unwrap(),
        };
        let args_end = matching(rest, open, '(', ')').ok_or("an unclosed call of a cooperative-matrix function")?;
        let args = split_args(&rest[open + 1..args_end]);
        let (matrix, target, stride) = match (kind, args.as_slice()) {
            (Kind::Load(_), [target, stride]) => (None, *target, *stride),
            (Kind::Store, [matrix, target, stride]) => (Some(*matrix), *target, *stride),
            _ => return Err(format!("unexpected arguments in `{}`", &rest[..=args_end])),
        };
        let (array, index) = parse_target(target).ok_or_else(|| format!("expected `&array[index]`, found `{target}`"))?;
        if !arrays.iter().any(|(n, _)| n == array) {
            return Err(format!("`{array}` is not a declared array of f16 or f32"));
        }
        let (row, col) = if transposed { (stride, "1u") } else { ("1u", stride) };
        let name = kind.function(array);
        match matrix {
            Some(m) => out.push_str(&format!("{name}({m}, {index}, {row}, {col})")),
            None => out.push_str(&format!("{name}({index}, {row}, {col})")),
        }
        if !used.iter().any(|(k, a)| *k == kind && a == array) {
            used.push((kind, array.to_string()));
        }
        rest = &rest[args_end + 1..];
    }
    out.push_str(rest);
    let body = out
        .replace("enable wgpu_cooperative_matrix;", "")
        .replace("coop_mat16x16<f32, C>", "CoopC")
        .replace("coop_mat16x16<f16, A>", "CoopA")
        .replace("coop_mat16x16<f16, B>", "CoopB");
    if let Some(at) = body.find("coop_mat16x16") {
        return Err(format!("a cooperative matrix type the emulation does not know: `{}`", &body[at..(at + 40).min(body.len())]));
    }
    let body = set_lane_in_entry_points(&body)?;
    // `enable` directives stay first; the emulation's declarations follow them.
    let split = body.rfind("enable f16;").map(|i| i + "enable f16;".len()).ok_or("the shader does not enable f16")?;
    let threads = largest_workgroup(&body)?;
    let mut lib = PRELUDE.replace("COOP_AB_HALVES", &format!("{}u", threads / 32 * 512));
    for (kind, array) in &used {
        let elem = &arrays.iter().find(|(n, _)| n == array).unwrap().1;
        lib.push_str(&access_function(*kind, array, elem));
    }
    Ok(format!("{}\n{lib}{}", &body[..split], &body[split..]))
}

const PRELUDE: &str = r#"
// ---- cooperative matrices, emulated (core/src/gpu/coop_emulation.rs) ----
alias CoopC = mat2x4<f32>;
alias CoopA = mat2x4<f32>;
alias CoopB = mat2x4<f32>;
// The thread's local_invocation_index: subgroup coop_thread / 32, lane coop_thread % 32.
var<private> coop_thread: u32;
// Per subgroup, a and b of its product in progress (row-major, 256 halves each).
var<workgroup> coop_ab: array<f16, COOP_AB_HALVES>;

fn coop_mma(a: CoopA, b: CoopB, c: CoopC) -> CoopC {
    let base = (coop_thread / 32u) * 512u;
    let r = (coop_thread % 32u) / 2u;
    let c0 = (coop_thread % 2u) * 8u;
    for (var j = 0u; j < 8u; j++) {
        coop_ab[base + r * 16u + c0 + j] = f16(a[j / 4u][j % 4u]);
        coop_ab[base + 256u + r * 16u + c0 + j] = f16(b[j / 4u][j % 4u]);
    }
    workgroupBarrier();
    var o = c;
    for (var j = 0u; j < 8u; j++) {
        var acc = 0.0;
        for (var k = 0u; k < 16u; k++) {
            acc += f32(coop_ab[base + r * 16u + k]) * f32(coop_ab[base + 256u + k * 16u + c0 + j]);
        }
        o[j / 4u][j % 4u] += acc;
    }
    workgroupBarrier();
    return o;
}
"#;

/// The operand a load makes.
#[derive(Clone, Copy, PartialEq)]
enum Role {
    A,
    B,
    C,
}

/// What a load or store call does: the emulation writes one function per kind and array.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Load(Role),
    Store,
}

impl Kind {
    fn function(self, array: &str) -> String {
        match self {
            Kind::Load(Role::A) => format!("coop_load_a_{array}"),
            Kind::Load(Role::B) => format!("coop_load_b_{array}"),
            Kind::Load(Role::C) => format!("coop_load_c_{array}"),
            Kind::Store => format!("coop_store_{array}"),
        }
    }
}

/// The emulation's load or store for `array` (elements of type `elem`), element (r, c) at
/// index + r·rs + c·cs.
fn access_function(kind: Kind, array: &str, elem: &str) -> String {
    let name = kind.function(array);
    match kind {
        Kind::Load(role) => {
            // The A and B operands are f16 on tensor cores, whatever the array holds.
            let value = if role == Role::C { format!("f32({array}[i + r * rs + (c0 + j) * cs])") } else { format!("f32(f16({array}[i + r * rs + (c0 + j) * cs]))") };
            format!(
                "
fn {name}(i: u32, rs: u32, cs: u32) -> CoopC {{
    var m = CoopC();
    let r = (coop_thread % 32u) / 2u;
    let c0 = (coop_thread % 2u) * 8u;
    for (var j = 0u; j < 8u; j++) {{
        m[j / 4u][j % 4u] = {value};
    }}
    return m;
}}
"
            )
        }
        Kind::Store => format!(
            "
fn {name}(m: CoopC, i: u32, rs: u32, cs: u32) {{
    var mv = m;
    let r = (coop_thread % 32u) / 2u;
    let c0 = (coop_thread % 2u) * 8u;
    for (var j = 0u; j < 8u; j++) {{
        {array}[i + r * rs + (c0 + j) * cs] = {elem}(mv[j / 4u][j % 4u]);
    }}
}}
"
        ),
    }
}

enum Call {
    Access { kind: Kind, transposed: bool },
    MultiplyAdd,
}

/// The next cooperative-matrix call in `text`: its offset and what it is.
fn next_call(text: &str) -> Option<(usize, Call)> {
    let mut from = 0;
    while let Some(i) = text[from..].find("coop").map(|i| i + from) {
        let after = &text[i..];
        let boundary = i == 0 || !text[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_');
        if boundary {
            for (name, call) in [("coopLoadT<", 0), ("coopLoad<", 1), ("coopStoreT(", 2), ("coopStore(", 3), ("coopMultiplyAdd(", 4)] {
                if after.starts_with(name) {
                    let ty = after.get(name.len()..).unwrap_or("");
                    let role = if ty.starts_with("coop_mat16x16<f32, C>") {
                        Role::C
                    } else if ty.starts_with("coop_mat16x16<f16, B>") {
                        Role::B
                    } else {
                        Role::A
                    };
                    let call = match call {
                        0 => Call::Access { kind: Kind::Load(role), transposed: true },
                        1 => Call::Access { kind: Kind::Load(role), transposed: false },
                        2 => Call::Access { kind: Kind::Store, transposed: true },
                        3 => Call::Access { kind: Kind::Store, transposed: false },
                        _ => Call::MultiplyAdd,
                    };
                    return Some((i, call));
                }
            }
        }
        from = i + 4;
    }
    None
}

/// The offset of the bracket closing the one at `open`.
fn matching(text: &str, open: usize, left: char, right: char) -> Option<usize> {
    let mut depth = 0usize;
    for (i, ch) in text[open..].char_indices() {
        if ch == left {
            depth += 1;
        } else if ch == right {
            depth -= 1;
            if depth == 0 {
                return Some(open + i);
            }
        }
    }
    None
}

/// Arguments split at the commas outside brackets, trimmed.
fn split_args(args: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, ch) in args.char_indices() {
        match ch {
            '(' | '[' | '<' => depth += 1,
            ')' | ']' | '>' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(args[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(args[start..].trim());
    parts.retain(|p| !p.is_empty());
    parts
}

/// `&name[index]` → (name, index).
fn parse_target(target: &str) -> Option<(&str, &str)> {
    let t = target.strip_prefix('&')?.trim();
    let open = t.find('[')?;
    let close = matching(t, open, '[', ']')?;
    (close == t.len() - 1).then(|| (t[..open].trim(), t[open + 1..close].trim()))
}

/// Module-scope arrays of f16 or f32: (name, element type).
fn declared_arrays(source: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for line in source.lines() {
        let line = line.trim_start();
        if !line.starts_with("var<") && !line.contains(" var<") {
            continue;
        }
        let Some(decl) = line.split_once("> ").map(|(_, d)| d) else { continue };
        let Some((name, ty)) = decl.split_once(':') else { continue };
        let ty = ty.trim_start();
        for elem in ["f16", "f32"] {
            if ty.starts_with(&format!("array<{elem}>")) || ty.starts_with(&format!("array<{elem},")) {
                found.push((name.trim().to_string(), elem.to_string()));
            }
        }
    }
    found
}

/// The largest `@workgroup_size` of the shader's entry points (one-dimensional, whole subgroups).
fn largest_workgroup(text: &str) -> Result<u32, String> {
    let mut largest = 0;
    for (at, _) in text.match_indices("@workgroup_size(") {
        let args = &text[at + 16..];
        let args = &args[..args.find(')').ok_or("an unclosed @workgroup_size")?];
        let n: u32 = args.trim().parse().map_err(|_| format!("@workgroup_size({args}): the emulation takes one-dimensional workgroups of whole subgroups"))?;
        if n % 32 != 0 {
            return Err(format!("@workgroup_size({n}) is not whole subgroups of 32"));
        }
        largest = largest.max(n);
    }
    Ok(largest)
}

/// Every `@compute` entry point sets `coop_thread` first, from its `local_invocation_index` (one
/// is added where it takes none).
fn set_lane_in_entry_points(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len() + 1024);
    let mut rest = text;
    while let Some(at) = rest.find("@compute") {
        let fn_at = at + rest[at..].find("fn ").ok_or("an @compute without fn")?;
        let open = fn_at + rest[fn_at..].find('(').ok_or("an entry point without parameters")?;
        let close = matching(rest, open, '(', ')').ok_or("an unclosed parameter list")?;
        let params = &rest[open + 1..close];
        let brace = close + rest[close..].find('{').ok_or("an entry point without a body")?;
        const BUILTIN: &str = "@builtin(local_invocation_index)";
        out.push_str(&rest[..close]);
        let index = match params.find(BUILTIN) {
            Some(p) => params[p + BUILTIN.len()..].trim_start().split(':').next().unwrap().trim().to_string(),
            None => {
                let sep = if params.trim().is_empty() { "" } else { ", " };
                out.push_str(&format!("{sep}{BUILTIN} coop_lii: u32"));
                "coop_lii".to_string()
            }
        };
        out.push_str(&rest[close..=brace]);
        out.push_str(&format!("\n    coop_thread = {index};"));
        rest = &rest[brace + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_loads_stores_and_products() {
        let src = "enable f16;\nenable wgpu_cooperative_matrix;\nvar<workgroup> t16: array<f16, 512>;\nvar<workgroup> o32: array<f32, 256>;\n@compute @workgroup_size(32)\nfn main(@builtin(local_invocation_index) tid: u32) {\n    let a = coopLoadT<coop_mat16x16<f16, A>>(&t16[f(1u, 2u)], 16u);\n    let b = coopLoad<coop_mat16x16<f16, B>>(&t16[256u], 16u);\n    var c = coop_mat16x16<f32, C>();\n    c = coopMultiplyAdd(a, b, c) * 2.0;\n    coopStoreT(c, &o32[0u], 16u);\n}\n";
        let out = emulate(src).unwrap();
        assert!(out.contains("coop_load_a_t16(f(1u, 2u), 16u, 1u)"), "{out}");
        assert!(out.contains("coop_load_b_t16(256u, 1u, 16u)"), "{out}");
        assert!(out.contains("coop_mma(a, b, c) * 2.0"), "{out}");
        assert!(out.contains("coop_store_o32(c, 0u, 16u, 1u)"), "{out}");
        assert!(out.contains("coop_thread = tid;"), "{out}");
        assert!(!out.contains("coop_mat16x16") && !out.contains("wgpu_cooperative_matrix"), "{out}");
    }
}
