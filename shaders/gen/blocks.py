"""The WGSL that reads weights in GGUF blocks (core/src/nn/blocks.rs), shared by the generators
of nn/matmul_vec4.wgsl and nn/matvec.wgsl, which put it into their f-strings as it is."""

BINDING = """// The `_q4_1` and `_q8_0` entry points read w in blocks of 32 values along a row (nn/blocks.rs;
// k divisible by 32): Q4_1 blocks of 5 words, pack2x16float(d, m) and 16 bytes of 4-bit codes,
// byte j holding value j in its low nibble and j + 16 in its high one; Q8_0 blocks of 9 words,
// d and 32 signed bytes. Both give back exactly the f32 values the host loaded.
@group(0) @binding(10) var<storage, read> w_blocks: array<u32>;
"""

READERS = """// Vec4 i of the k values (a row holds k/32 blocks, so quad i % 8 of block i / 8). q·d is exact
// in f32, so q·d + m rounds once whether or not it is fused: the host's value.
fn w_q4_1(i: u32) -> vec4<f32> {
    let b = (i / 8u) * 5u;
    let quad = i % 8u;
    let dm = unpack2x16float(w_blocks[b]);
    // Quads 0-3 are the low nibbles of code words 0-3, quads 4-7 their high nibbles.
    return q4_1_quad(w_blocks[b + 1u + quad % 4u] >> (4u * (quad / 4u)), dm);
}

fn w_q8_0(i: u32) -> vec4<f32> {
    let b = (i / 8u) * 9u;
    return q8_0_quad(w_blocks[b + 1u + i % 8u], bitcast<f32>(w_blocks[b]));
}

// Four values from the low nibbles of a Q4_1 code word (shifted right by 4 for the high ones).
fn q4_1_quad(codes: u32, dm: vec2<f32>) -> vec4<f32> {
    let q = (vec4<u32>(codes) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);
    return vec4<f32>(q) * dm.x + dm.y;
}

// Four values from a Q8_0 code word of four signed bytes.
fn q8_0_quad(codes: u32, d: f32) -> vec4<f32> {
    let q = bitcast<vec4<i32>>(vec4<u32>(codes) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
    return vec4<f32>(q) * d;
}
"""

# (entry suffix, reader) of the two block formats.
FORMATS = (("_q4_1", "w_q4_1"), ("_q8_0", "w_q8_0"))
