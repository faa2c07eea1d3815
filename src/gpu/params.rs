//! Kernel parameters, declared once.
//!
//! Every kernel reads a uniform `Params` struct at binding 0. Its wrapper declares it with
//! [`kernel_params!`], which writes the `#[repr(C)]` struct the wrapper fills and, as
//! [`KernelParams::WGSL`], the same struct in WGSL; the pipeline cache puts that text before
//! the shader's source, so a `.wgsl` file uses `P: Params` without declaring it and the two
//! sides cannot drift apart. Fields are `u32`, `i32` or `f32`, which mean the same on both
//! sides and are laid out alike (4 bytes each, in order).
//!
//! A [`Shader<P>`] names a kernel family and its parameters, and the pipelines compiled from
//! it are [`Kernel<P>`]s, so a dispatch only takes the parameters its shader declares.

use super::pools::pipelines::shader_source;
use std::marker::PhantomData;
use std::sync::Arc;

/// A kernel's uniform parameters (binding 0), as declared by `kernel_params!`.
pub trait KernelParams: bytemuck::Pod {
    /// The struct in WGSL, named `Params`.
    const WGSL: &'static str;
}

/// The field types `kernel_params!` accepts.
pub trait WgslScalar: bytemuck::Pod {}
impl WgslScalar for u32 {}
impl WgslScalar for i32 {}
impl WgslScalar for f32 {}

/// Declares a kernel's `Params` once: the Rust struct (plain old data, `Default` all
/// zeros) and its WGSL twin as [`KernelParams::WGSL`]. Field docs become Rust docs.
macro_rules! kernel_params {
    (
        $(#[$m:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fm:meta])* $f:ident : $t:ident ),* $(,)?
        }
    ) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        $vis struct $name {
            $( $(#[$fm])* $f: $t, )*
        }

        impl $crate::gpu::KernelParams for $name {
            const WGSL: &'static str = concat!(
                "struct Params {\n",
                $( "    ", stringify!($f), ": ", stringify!($t), ",\n", )*
                "}\n"
            );
        }

        // Only scalars that WGSL lays out as Rust does.
        const _: fn() = || {
            fn scalar<T: $crate::gpu::WgslScalar>() {}
            $( scalar::<$t>(); )*
        };
    };
}
pub(crate) use kernel_params;

/// A kernel family: its name (for the pipeline cache and the profiler), its WGSL source
/// (includes concatenated) and the parameters `P` every entry point reads.
pub struct Shader<P> {
    pub name: &'static str,
    pub source: &'static str,
    params: PhantomData<fn() -> P>,
}

impl<P> Shader<P> {
    pub const fn new(name: &'static str, source: &'static str) -> Shader<P> {
        Shader {
            name,
            source,
            params: PhantomData,
        }
    }
}

impl<P: KernelParams> Shader<P> {
    /// The shader's text without its parameter type (for lists of shaders of any `P`).
    pub const fn code(&self) -> ShaderCode {
        ShaderCode {
            name: self.name,
            params: P::WGSL,
            source: self.source,
        }
    }
}

/// What the pipeline cache assembles a shader from: its name, its `Params` struct in WGSL
/// and its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShaderCode {
    pub name: &'static str,
    pub params: &'static str,
    pub source: &'static str,
}

/// One pipeline of a shader: the entry point and the defines it was compiled with, as the
/// `const NAME = value;` lines the pipeline cache puts before the source.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShaderVariant {
    pub shader: ShaderCode,
    pub entry: &'static str,
    pub defines: String,
}

impl ShaderVariant {
    /// The WGSL source the pipeline cache compiles for this variant on a device whose
    /// prelude is `device_prelude` (see [`crate::gpu::shader_prelude`]; it applies only to
    /// shaders that use subgroups).
    pub fn source(&self, device_prelude: &str) -> String {
        let prelude = if self.shader.source.contains("subgroup") {
            device_prelude
        } else {
            ""
        };
        shader_source(
            prelude,
            self.shader.params,
            &self.defines,
            self.shader.source,
        )
    }
}

/// One compiled entry point of a [`Shader<P>`]; [`crate::gpu::Recorder::dispatch`] takes
/// its `P`.
pub struct Kernel<P> {
    pub(crate) pipeline: Arc<wgpu::ComputePipeline>,
    params: PhantomData<fn() -> P>,
}

impl<P> Kernel<P> {
    pub(crate) fn new(pipeline: Arc<wgpu::ComputePipeline>) -> Kernel<P> {
        Kernel {
            pipeline,
            params: PhantomData,
        }
    }
}

impl<P> Clone for Kernel<P> {
    fn clone(&self) -> Self {
        Kernel::new(self.pipeline.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    kernel_params! {
        /// A test struct.
        struct Example {
            /// A documented field.
            rows: u32,
            scale: f32,
            delta: i32,
            _pad: u32,
        }
    }

    #[test]
    fn the_wgsl_twin_lists_the_fields_in_order() {
        assert_eq!(
            Example::WGSL,
            "struct Params {\n    rows: u32,\n    scale: f32,\n    delta: i32,\n    _pad: u32,\n}\n"
        );
        let p = Example {
            rows: 3,
            scale: 0.5,
            delta: -2,
            _pad: 0,
        };
        let words: Vec<u32> = bytemuck::cast_slice(bytemuck::bytes_of(&p)).to_vec();
        assert_eq!(words, [3, 0.5f32.to_bits(), (-2i32) as u32, 0]);
        assert_eq!(std::mem::size_of::<Example>(), 16);
    }
}
