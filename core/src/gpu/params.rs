//! Each shader's uniform parameter block as a Rust type. A shader file declares one
//! `struct Params` at binding 0; its Rust twin is declared with `shader_params!` in
//! crate::shaders, which records the field names and scalar kinds so a test can compare them
//! with the WGSL through naga's reflection (tests/shaders.rs).

/// The scalar kinds a parameter block holds: shapes as u32, scalars as f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scalar {
    U32,
    F32,
}

/// A Rust field type of a parameter block.
pub trait ParamScalar {
    const SCALAR: Scalar;
}
impl ParamScalar for u32 {
    const SCALAR: Scalar = Scalar::U32;
}
impl ParamScalar for f32 {
    const SCALAR: Scalar = Scalar::F32;
}

/// The `#[repr(C)]` twin of a shader file's `struct Params`.
pub trait ShaderParams: bytemuck::Pod {
    /// The shader files (names in crate::shaders::ALL) whose `struct Params` this is.
    const SHADERS: &'static [&'static str];
    /// Field names and kinds in declaration order.
    const FIELDS: &'static [(&'static str, Scalar)];
}

/// What the shader test needs of one parameter type, without naming it.
#[derive(Clone, Copy, Debug)]
pub struct ParamsLayout {
    pub rust_name: &'static str,
    pub shaders: &'static [&'static str],
    pub fields: &'static [(&'static str, Scalar)],
    pub size: usize,
}

impl ParamsLayout {
    pub const fn of<P: ShaderParams>(rust_name: &'static str) -> Self {
        ParamsLayout { rust_name, shaders: P::SHADERS, fields: P::FIELDS, size: std::mem::size_of::<P>() }
    }
}

/// Declares a parameter block: `shader_params!(Name for ["nn/rmsnorm"] { rows: u32, eps: f32 })`
/// gives a Pod struct with those fields (all 4 bytes, so `repr(C)` has no padding) and its
/// `ShaderParams` implementation.
macro_rules! shader_params {
    ($(#[$meta:meta])* $name:ident for [$($shader:literal),+] { $($(#[$fmeta:meta])* $field:ident: $ty:ty),+ $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty),+
        }
        impl $crate::gpu::ShaderParams for $name {
            const SHADERS: &'static [&'static str] = &[$($shader),+];
            const FIELDS: &'static [(&'static str, $crate::gpu::Scalar)] =
                &[$((stringify!($field), <$ty as $crate::gpu::ParamScalar>::SCALAR)),+];
        }
    };
}
pub(crate) use shader_params;
