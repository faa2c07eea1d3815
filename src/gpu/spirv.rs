//! SPIR-V for the shaders that use cooperative matrices (the tensor-core GEMM tile).
//!
//! wgpu 30 declares the Vulkan memory model for any shader with cooperative matrices but
//! emits its loads, stores and barriers as if the GLSL450 model still applied
//! (gfx-rs/wgpu#8805): under the Vulkan model an access without `NonPrivatePointer` is
//! private to its invocation, so `workgroupBarrier()` does not order it, and a barrier
//! without `MakeAvailable | MakeVisible` does not publish writes. On the H200 the tile read
//! stale workgroup memory (wrong GEMM results). sparsa therefore compiles these shaders
//! with naga itself, marks every access to workgroup memory `NonPrivatePointer` and gives
//! every barrier over workgroup memory availability and visibility semantics
//! ([`publish_workgroup_memory`]), and hands the words to the driver as a passthrough module
//! with the bind group layout naga's reflection gives (see `Gpu::pipeline`).

use crate::error::{Error, Result};

// Opcodes and operand values from the SPIR-V specification.
const OP_TYPE_POINTER: u32 = 32;
const OP_CONSTANT: u32 = 43;
const OP_FUNCTION: u32 = 54;
const OP_VARIABLE: u32 = 59;
const OP_LOAD: u32 = 61;
const OP_STORE: u32 = 62;
const OP_ACCESS_CHAIN: u32 = 65;
const OP_IN_BOUNDS_ACCESS_CHAIN: u32 = 66;
const OP_PTR_ACCESS_CHAIN: u32 = 67;
const OP_COPY_OBJECT: u32 = 83;
const OP_CONTROL_BARRIER: u32 = 224;
const OP_MEMORY_BARRIER: u32 = 225;
const OP_COOP_LOAD: u32 = 4457;
const OP_COOP_STORE: u32 = 4458;
const STORAGE_WORKGROUP: u32 = 4;
const MEM_NON_PRIVATE_POINTER: u32 = 0x20;
const SEM_ORDERING: u32 = 0x2 | 0x4 | 0x8 | 0x10; // Acquire, Release, AcquireRelease, SeqCst
const SEM_WORKGROUP_MEMORY: u32 = 0x100;
const SEM_MAKE_AVAILABLE: u32 = 0x2000;
const SEM_MAKE_VISIBLE: u32 = 0x4000;

/// An entry point compiled by [`compile`].
pub struct Compiled {
    pub words: Vec<u32>,
    /// The module's bind group 0 layout entries that the entry point uses.
    pub layout: Vec<wgpu::BindGroupLayoutEntry>,
    /// Bytes of workgroup memory the entry point's variables take. A passthrough module is
    /// not validated by wgpu, so the caller checks this against the device's limit (a
    /// driver given a shader over it hung, on the H200).
    pub workgroup_bytes: u32,
}

/// Compiles `entry` of the WGSL `source` to SPIR-V 1.6 for a Vulkan device: buffer and
/// index bounds checks kept (clamped accesses), no loop bounding or division checks (as for
/// sparsa's other shaders, see `Gpu::shader_module`).
pub fn compile(source: &str, entry: &str) -> Result<Compiled> {
    // `SPARSA_SPIRV_PUBLISH=0` leaves the words as naga wrote them: a measurement aid, to see
    // what the memory model's ordering costs (results may be wrong without it).
    compile_with(
        source,
        entry,
        crate::knobs::knob_on!("SPARSA_SPIRV_PUBLISH"),
    )
}

/// [`compile`], with the workgroup accesses published under the Vulkan memory model only
/// where `publish` is set (a module with no cooperative matrices keeps naga's GLSL450 model,
/// where that rewrite does not apply).
pub fn compile_with(source: &str, entry: &str, publish: bool) -> Result<Compiled> {
    let fail = |what: &str, e: String| Error::msg(format!("shader entry {entry}: {what}: {e}"));
    let module =
        naga::front::wgsl::parse_str(source).map_err(|e| fail("WGSL", e.emit_to_string(source)))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| fail("validation", e.emit_to_string(source)))?;
    let ep = module
        .entry_points
        .iter()
        .position(|e| e.name == entry)
        .ok_or_else(|| fail("lookup", "no such entry point".into()))?;
    let ep_info = info.get_entry_point(ep);
    let mut workgroup_bytes = 0u32;
    for (handle, var) in module.global_variables.iter() {
        if var.space == naga::AddressSpace::WorkGroup && !ep_info[handle].is_empty() {
            let size = module.types[var.ty].inner.size(module.to_ctx());
            workgroup_bytes += size.next_multiple_of(16);
        }
    }
    let mut layout = Vec::new();
    for (handle, var) in module.global_variables.iter() {
        let Some(binding) = &var.binding else {
            continue;
        };
        if binding.group != 0 || ep_info[handle].is_empty() {
            continue;
        }
        let ty = match var.space {
            naga::AddressSpace::Uniform => wgpu::BufferBindingType::Uniform,
            naga::AddressSpace::Storage { access } => wgpu::BufferBindingType::Storage {
                read_only: !access.contains(naga::StorageAccess::STORE),
            },
            _ => {
                return Err(fail(
                    "layout",
                    format!("binding {} is not a buffer", binding.binding),
                ))
            }
        };
        layout.push(wgpu::BindGroupLayoutEntry {
            binding: binding.binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
    }
    layout.sort_by_key(|e| e.binding);
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::Restrict,
            buffer: naga::proc::BoundsCheckPolicy::Restrict,
            image_load: naga::proc::BoundsCheckPolicy::Restrict,
            binding_array: naga::proc::BoundsCheckPolicy::Restrict,
        },
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: false,
        emit_int_div_checks: false,
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry.to_string(),
    };
    let mut words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| fail("SPIR-V", e.to_string()))?;
    if publish {
        publish_workgroup_memory(&mut words)?;
    }
    Ok(Compiled {
        words,
        layout,
        workgroup_bytes,
    })
}

/// One instruction: its offset in the words and its length.
fn instructions(words: &[u32]) -> Result<Vec<(usize, usize)>> {
    let mut out = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let n = (words[at] >> 16) as usize;
        if n == 0 || at + n > words.len() {
            return Err(Error::msg(format!(
                "SPIR-V: bad instruction length at word {at}"
            )));
        }
        out.push((at, n));
        at += n;
    }
    Ok(out)
}

/// Rewrites a SPIR-V module under the Vulkan memory model so that workgroup memory shared
/// through barriers is ordered: `NonPrivatePointer` on every load and store (plain and
/// cooperative-matrix) whose pointer is into workgroup memory, and `MakeAvailable |
/// MakeVisible` added to every barrier whose semantics order workgroup memory (new
/// constants, appended before the first function).
pub fn publish_workgroup_memory(words: &mut Vec<u32>) -> Result<()> {
    if words.len() < 5 || words[0] != 0x0723_0203 {
        return Err(Error::msg("SPIR-V: not a module (bad magic number)"));
    }
    let list = instructions(words)?;
    let mut wg_types = std::collections::HashSet::new();
    let mut wg_ptrs = std::collections::HashSet::new();
    let mut consts = std::collections::HashMap::new();
    let mut first_fn = words.len();
    for &(at, n) in &list {
        let op = words[at] & 0xffff;
        let w = &words[at..at + n];
        match op {
            OP_TYPE_POINTER if n >= 3 && w[2] == STORAGE_WORKGROUP => {
                wg_types.insert(w[1]);
            }
            OP_CONSTANT if n == 4 => {
                consts.insert(w[2], (w[1], w[3]));
            }
            OP_VARIABLE
            | OP_ACCESS_CHAIN
            | OP_IN_BOUNDS_ACCESS_CHAIN
            | OP_PTR_ACCESS_CHAIN
            | OP_COPY_OBJECT
                if n >= 3 && wg_types.contains(&w[1]) =>
            {
                wg_ptrs.insert(w[2]);
            }
            OP_FUNCTION if first_fn == words.len() => first_fn = at,
            _ => {}
        }
    }
    let mut bound = words[3];
    let mut new_consts: Vec<u32> = Vec::new();
    let mut replaced = std::collections::HashMap::new();
    // Offsets of the accesses that get a memory-operand word (they had none).
    let mut grow: Vec<usize> = Vec::new();
    for &(at, n) in &list {
        let op = words[at] & 0xffff;
        let (ptr_ix, mask_ix) = match op {
            OP_LOAD => (3, 4),
            OP_STORE => (1, 3),
            OP_COOP_LOAD => (3, 6),
            OP_COOP_STORE => (1, 5),
            OP_CONTROL_BARRIER | OP_MEMORY_BARRIER => {
                let sem_ix = if op == OP_CONTROL_BARRIER { 3 } else { 2 };
                if n <= sem_ix {
                    continue;
                }
                let id = words[at + sem_ix];
                let Some(&(ty, v)) = consts.get(&id) else {
                    continue;
                };
                if v & SEM_WORKGROUP_MEMORY == 0 || v & SEM_ORDERING == 0 {
                    continue;
                }
                let nid = *replaced.entry(id).or_insert_with(|| {
                    let nid = bound;
                    bound += 1;
                    new_consts.extend([
                        (4 << 16) | OP_CONSTANT,
                        ty,
                        nid,
                        v | SEM_MAKE_AVAILABLE | SEM_MAKE_VISIBLE,
                    ]);
                    nid
                });
                words[at + sem_ix] = nid;
                continue;
            }
            _ => continue,
        };
        if n <= ptr_ix || !wg_ptrs.contains(&words[at + ptr_ix]) {
            continue;
        }
        if n > mask_ix {
            words[at + mask_ix] |= MEM_NON_PRIVATE_POINTER;
        } else if n == mask_ix {
            grow.push(at);
        } else {
            return Err(Error::msg(format!(
                "SPIR-V: opcode {op} at word {at} has {n} words, fewer than its operands"
            )));
        }
    }
    // Rebuild with the grown instructions and the new constants.
    let mut out = Vec::with_capacity(words.len() + grow.len() + new_consts.len());
    out.extend_from_slice(&words[..5]);
    let mut g = grow.iter().peekable();
    for &(at, n) in &list {
        if at == first_fn {
            out.extend_from_slice(&new_consts);
        }
        if g.peek() == Some(&&at) {
            g.next();
            out.push(words[at] + (1 << 16));
            out.extend_from_slice(&words[at + 1..at + n]);
            out.push(MEM_NON_PRIVATE_POINTER);
        } else {
            out.extend_from_slice(&words[at..at + n]);
        }
    }
    if first_fn == words.len() {
        out.extend_from_slice(&new_consts);
    }
    out[3] = bound;
    *words = out;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHADER: &str = "
enable f16;
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read_write> unused: array<f32>;
var<workgroup> a: array<f16, 256>;
var<workgroup> c: array<f32, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) lid: u32) {
    for (var i = 0u; i < 8u; i++) {
        a[lid * 8u + i] = f16(src[lid * 8u + i]);
    }
    workgroupBarrier();
    let m = coopLoadT<coop_mat16x16<f16, A>>(&a[0], 16u);
    let n = coopLoad<coop_mat16x16<f16, B>>(&a[0], 16u);
    let r = coopMultiplyAdd(m, n, coop_mat16x16<f32, C>());
    coopStoreT(r, &c[0], 16u);
    workgroupBarrier();
    dst[lid] = c[lid] + c[lid + 32u];
}
";

    fn decode(words: &[u32]) -> Vec<(u32, Vec<u32>)> {
        instructions(words)
            .unwrap()
            .into_iter()
            .map(|(at, n)| (words[at] & 0xffff, words[at + 1..at + n].to_vec()))
            .collect()
    }

    #[test]
    fn workgroup_accesses_become_non_private_and_barriers_publish() {
        let Compiled {
            words,
            layout,
            workgroup_bytes,
        } = compile(SHADER, "main").unwrap();
        // 256 f16 and 256 f32.
        assert_eq!(workgroup_bytes, 512 + 1024);
        // Bindings 0 (read-only) and 1 (read-write); 2 is not used by the entry point.
        let kinds: Vec<_> = layout
            .iter()
            .map(|e| match e.ty {
                wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only },
                    ..
                } => (e.binding, read_only),
                _ => panic!("unexpected binding {e:?}"),
            })
            .collect();
        assert_eq!(kinds, vec![(0, true), (1, false)]);
        let ins = decode(&words);
        let wg_types: Vec<u32> = ins
            .iter()
            .filter(|(op, w)| *op == OP_TYPE_POINTER && w[1] == STORAGE_WORKGROUP)
            .map(|(_, w)| w[0])
            .collect();
        assert!(!wg_types.is_empty());
        let mut wg = std::collections::HashSet::new();
        for (op, w) in &ins {
            if [OP_VARIABLE, OP_ACCESS_CHAIN, OP_IN_BOUNDS_ACCESS_CHAIN].contains(op)
                && wg_types.contains(&w[0])
            {
                wg.insert(w[1]);
            }
        }
        let consts: std::collections::HashMap<u32, u32> = ins
            .iter()
            .filter(|(op, w)| *op == OP_CONSTANT && w.len() == 3)
            .map(|(_, w)| (w[1], w[2]))
            .collect();
        let (mut loads, mut stores, mut coop, mut barriers) = (0, 0, 0, 0);
        for (op, w) in &ins {
            let (ptr, mask) = match *op {
                OP_LOAD => (w[2], w.get(3)),
                OP_STORE => (w[0], w.get(2)),
                OP_COOP_LOAD => (w[2], w.get(5)),
                OP_COOP_STORE => (w[0], w.get(4)),
                OP_CONTROL_BARRIER => {
                    let v = consts[&w[2]];
                    assert_eq!(
                        v & (SEM_MAKE_AVAILABLE | SEM_MAKE_VISIBLE),
                        0x6000,
                        "{v:#x}"
                    );
                    barriers += 1;
                    continue;
                }
                _ => continue,
            };
            if wg.contains(&ptr) {
                let mask = mask.copied().unwrap_or(0);
                assert_ne!(
                    mask & MEM_NON_PRIVATE_POINTER,
                    0,
                    "opcode {op} without NonPrivate"
                );
                match *op {
                    OP_LOAD => loads += 1,
                    OP_STORE => stores += 1,
                    _ => coop += 1,
                }
            }
        }
        assert!(loads >= 2 && stores >= 1 && coop == 3 && barriers == 2);
        // Every instruction's length adds up to the module's size.
        let total: usize = instructions(&words).unwrap().iter().map(|x| x.1).sum();
        assert_eq!(total + 5, words.len());
    }

    #[test]
    fn bad_modules_are_errors() {
        let mut w = vec![1, 2, 3];
        assert!(publish_workgroup_memory(&mut w).is_err());
        let mut w = vec![0x0723_0203, 0x10600, 0, 10, 0, 0x0005_003d, 1];
        assert!(publish_workgroup_memory(&mut w).is_err());
    }
}
