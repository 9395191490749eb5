//! Which weights a matvec kernel launch read, from its template arguments and grid against the
//! model's tensors (the GGUF header).
//!
//! The mapping, per kernel (ggml-cuda at the pin, single-token decode):
//!
//! - `mul_mat_vec_q<type, ncols_dst, has_fusion, small_k, …>` (mmvq.cu): grid
//!   (⌈rows / rows_per_block⌉, channels, samples), block (warp, nwarps). rows_per_block is 1, or
//!   nwarps (blockDim.y) when small_k.
//! - `mul_mat_vec_f<T, type_acc, ncols_dst, block_size, has_fusion, …>` (mmvf.cu): grid (rows,
//!   channels, samples); T is the weight's element type (float, half, nv_bfloat16).
//!
//! channels > 1 is MUL_MAT_ID: one expert matrix per channel (the used experts) of a 3-D
//! tensor. has_fusion reads a second matrix of the same shape (the GLU gate ggml-cuda fuses into
//! the up projection; bias-only fusion, for models with biases, would be counted twice). The
//! candidates are the model's weight matrices of that type whose row count fits the grid (2-D
//! for one channel, 3-D with at least that many matrices for several), for a fused launch only
//! gate/up twins (`ffn_gate_X` and `ffn_up_X` of one shape); the launch is attributed when every
//! candidate implies the same bytes, else it is reported with the reason.

use serde::{Deserialize, Serialize};

use super::kernel_name::{KernelName, TemplateArg};
use crate::bench;
use crate::gguf::Header;

/// A weight tensor as the profile needs it (kept in inputs.json for re-analysis).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightTensor {
    pub name: String,
    pub ggml_type: u32,
    /// ggml order: dims[0] is the row length.
    pub dims: Vec<u64>,
}

impl WeightTensor {
    /// The name without its layer: `blk.3.ffn_up_exps.weight` → `ffn_up_exps`.
    pub fn role(&self) -> String {
        role_of(&self.name)
    }

    fn rows(&self) -> u64 {
        self.dims.get(1).copied().unwrap_or(1)
    }

    fn matrices(&self) -> u64 {
        self.dims.iter().skip(2).product()
    }

    fn row_bytes(&self) -> Option<u64> {
        let (per, bytes) = bench::type_block(self.ggml_type)?;
        Some(self.dims.first()? / per * bytes)
    }
}

/// The tensors a matvec can read: every weight except the token embedding (read by get_rows)
/// and the norms (read by the norm kernels).
pub fn weight_tensors(header: &Header) -> Vec<WeightTensor> {
    header
        .tensors
        .iter()
        .filter(|t| t.name != "token_embd.weight" && !t.name.contains("norm"))
        .map(|t| WeightTensor {
            name: t.name.clone(),
            ggml_type: t.ggml_type,
            dims: t.dims.clone(),
        })
        .collect()
}

/// How a matvec kernel's template arguments and grid describe the weights it reads.
struct MatvecKernel {
    /// The kernel's function name.
    function: &'static str,
    weight_type: WeightType,
    /// Index of the ncols_dst argument (1 for decode).
    ncols_dst: usize,
    /// Index of has_fusion.
    has_fusion: usize,
    /// Index of small_k, where rows_per_block is blockDim.y.
    small_k: Option<usize>,
}

enum WeightType {
    /// A `ggml_type` value argument.
    GgmlType(usize),
    /// An element type argument (float, half, nv_bfloat16).
    Element(usize),
}

/// A tensor name without its layer and suffix: `blk.3.ffn_up_exps.weight` → `ffn_up_exps`.
pub fn role_of(name: &str) -> String {
    let name = name.strip_suffix(".weight").unwrap_or(name);
    match name.strip_prefix("blk.") {
        Some(rest) => rest
            .split_once('.')
            .map_or(rest, |(_, role)| role)
            .to_owned(),
        None => name.to_owned(),
    }
}

/// The weight-reading kernels; a new one joins with a line here.
const MATVEC_KERNELS: &[MatvecKernel] = &[
    MatvecKernel {
        function: "mul_mat_vec_q",
        weight_type: WeightType::GgmlType(0),
        ncols_dst: 1,
        has_fusion: 2,
        small_k: Some(3),
    },
    MatvecKernel {
        function: "mul_mat_vec_f",
        weight_type: WeightType::Element(0),
        ncols_dst: 2,
        has_fusion: 4,
        small_k: None,
    },
];

/// True for the kernels [`attribute`] handles.
pub fn reads_weights(name: &KernelName) -> bool {
    MATVEC_KERNELS.iter().any(|k| k.function == name.function())
}

/// What one launch read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub bytes: u64,
    /// The candidate tensors' roles, e.g. `ffn_gate_exps / ffn_up_exps`.
    pub weights: String,
}

pub fn ggml_type_name(ggml_type: u32) -> String {
    match ggml_type {
        0 => "F32".into(),
        1 => "F16".into(),
        2 => "Q4_0".into(),
        3 => "Q4_1".into(),
        6 => "Q5_0".into(),
        7 => "Q5_1".into(),
        8 => "Q8_0".into(),
        10 => "Q2_K".into(),
        11 => "Q3_K".into(),
        12 => "Q4_K".into(),
        13 => "Q5_K".into(),
        14 => "Q6_K".into(),
        30 => "BF16".into(),
        other => format!("ggml type {other}"),
    }
}

/// The weights a launch of a [`reads_weights`] kernel read, or why that cannot be told.
pub fn attribute(
    name: &KernelName,
    grid: [u32; 3],
    block: [u32; 3],
    tensors: &[WeightTensor],
) -> Result<Attribution, String> {
    let kernel = MATVEC_KERNELS
        .iter()
        .find(|k| k.function == name.function())
        .ok_or_else(|| format!("{} is not a matvec kernel", name.function()))?;
    let args = name
        .template_args
        .as_ref()
        .ok_or("its template arguments could not be read from the mangled name")?;
    let value = |i: usize| match args.get(i) {
        Some(TemplateArg::Value(v)) => Ok(*v),
        other => Err(format!("template argument {i} is {other:?}, not a value")),
    };
    let ncols = value(kernel.ncols_dst)?;
    if ncols != 1 {
        return Err(format!(
            "ncols_dst {ncols}: a batch of tokens, not a decode step"
        ));
    }
    let ggml_type = match kernel.weight_type {
        WeightType::GgmlType(i) => {
            u32::try_from(value(i)?).map_err(|_| format!("ggml type {}", value(i).unwrap_or(-1)))?
        }
        WeightType::Element(i) => match args.get(i) {
            Some(TemplateArg::Type(t)) if t == "float" => 0,
            Some(TemplateArg::Type(t)) if t == "half" || t == "__half" => 1,
            Some(TemplateArg::Type(t)) if t == "__nv_bfloat16" => 30,
            other => return Err(format!("element type {other:?}")),
        },
    };
    let fused = value(kernel.has_fusion)? != 0;
    let rows_per_block = match kernel.small_k {
        Some(i) if value(i)? != 0 => u64::from(block[1].max(1)),
        _ => 1,
    };
    let blocks = u64::from(grid[0]);
    let rows = (blocks.saturating_sub(1) * rows_per_block + 1)..=(blocks * rows_per_block);
    let channels = u64::from(grid[1].max(1));
    let fits = |t: &&WeightTensor| {
        t.ggml_type == ggml_type
            && rows.contains(&t.rows())
            && if channels > 1 {
                t.dims.len() >= 3 && t.matrices() >= channels
            } else {
                t.dims.len() <= 2
            }
    };
    let mut candidates: Vec<&WeightTensor> = tensors.iter().filter(fits).collect();
    if candidates.is_empty() && channels == 1 {
        // A MoE that uses one expert per token.
        candidates = tensors
            .iter()
            .filter(|t| t.ggml_type == ggml_type && rows.contains(&t.rows()) && t.dims.len() >= 3)
            .collect();
    }
    if fused {
        // ggml-cuda fuses the GLU's gate into the up projection: keep gate/up twins.
        let all = candidates.clone();
        candidates.retain(|t| {
            let twins = [
                t.name.replacen("_gate", "_up", 1),
                t.name.replacen("_up", "_gate", 1),
            ];
            all.iter()
                .any(|u| u.name != t.name && u.dims == t.dims && twins.contains(&u.name))
        });
    }
    let shape = format!(
        "{} weights with {}{} rows{}",
        ggml_type_name(ggml_type),
        if rows.start() == rows.end() {
            ""
        } else {
            "≤ "
        },
        rows.end(),
        if channels > 1 {
            format!(", {channels} experts")
        } else {
            String::new()
        }
    );
    let mut implied = Vec::new();
    for t in &candidates {
        let row_bytes = t
            .row_bytes()
            .ok_or_else(|| format!("{}: no block size known for its type", t.name))?;
        let matrices = if t.dims.len() >= 3 { channels } else { 1 };
        implied.push(t.rows() * row_bytes * matrices * if fused { 2 } else { 1 });
    }
    let mut roles: Vec<String> = candidates.iter().map(|t| t.role()).collect();
    roles.sort();
    roles.dedup();
    match implied.first() {
        None if fused => Err(format!(
            "fused (gate and up), but the model has no gate/up twins among its {shape}"
        )),
        None => Err(format!("the model has no {shape}")),
        Some(&bytes) if implied.iter().all(|&b| b == bytes) => Ok(Attribution {
            bytes,
            weights: roles.join(" / "),
        }),
        Some(_) => Err(format!(
            "ambiguous: {shape} of different sizes ({})",
            roles.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, ggml_type: u32, dims: &[u64]) -> WeightTensor {
        WeightTensor {
            name: name.into(),
            ggml_type,
            dims: dims.to_vec(),
        }
    }

    /// One qwen35moe layer's matrices (synth's shapes and types) and the LM head.
    fn qwen36_layer() -> Vec<WeightTensor> {
        vec![
            tensor("output.weight", 14, &[2048, 248320]),
            tensor("blk.0.attn_qkv.weight", 12, &[2048, 8192]),
            tensor("blk.0.attn_gate.weight", 12, &[2048, 4096]),
            tensor("blk.0.ssm_beta.weight", 8, &[2048, 32]),
            tensor("blk.0.ssm_out.weight", 12, &[4096, 2048]),
            tensor("blk.0.ssm_conv1d.weight", 0, &[4, 8192]),
            tensor("blk.0.ffn_gate_inp.weight", 0, &[2048, 256]),
            tensor("blk.0.ffn_gate_exps.weight", 12, &[2048, 512, 256]),
            tensor("blk.0.ffn_up_exps.weight", 12, &[2048, 512, 256]),
            tensor("blk.0.ffn_down_exps.weight", 14, &[512, 2048, 256]),
            tensor("blk.0.ffn_gate_inp_shexp.weight", 0, &[2048]),
            tensor("blk.0.ffn_gate_shexp.weight", 12, &[2048, 512]),
            tensor("blk.0.ffn_up_shexp.weight", 12, &[2048, 512]),
            tensor("blk.0.ffn_down_shexp.weight", 14, &[512, 2048]),
            tensor("blk.3.attn_q.weight", 12, &[2048, 8192]),
            // In the shared expert's layer, with its shape: not a gate/up twin.
            tensor("blk.0.attn_k.weight", 12, &[2048, 512]),
            tensor("blk.3.attn_output.weight", 12, &[4096, 2048]),
        ]
    }

    fn mmvq(ggml_type: i64, fused: bool, small_k: bool) -> KernelName {
        KernelName {
            path: vec!["mul_mat_vec_q".into()],
            template_args: Some(vec![
                TemplateArg::Value(ggml_type),
                TemplateArg::Value(1),
                TemplateArg::Value(fused.into()),
                TemplateArg::Value(small_k.into()),
                TemplateArg::Value(0),
            ]),
        }
    }

    fn mmvf(element: &str) -> KernelName {
        KernelName {
            path: vec!["mul_mat_vec_f".into()],
            template_args: Some(vec![
                TemplateArg::Type(element.into()),
                TemplateArg::Type("float".into()),
                TemplateArg::Value(1),
                TemplateArg::Value(128),
                TemplateArg::Value(0),
                TemplateArg::Value(0),
            ]),
        }
    }

    const Q4_K_ROW_2048: u64 = 2048 / 256 * 144;

    #[test]
    fn dense_matvecs_read_rows_times_row_bytes() {
        let t = qwen36_layer();
        // The LM head: Q6_K, 248320 rows of 2048 (210 bytes per 256).
        assert_eq!(
            attribute(&mmvq(14, false, false), [248320, 1, 1], [32, 4, 1], &t),
            Ok(Attribution {
                bytes: 248320 * 2048 / 256 * 210,
                weights: "output".into()
            })
        );
        // attn_q and attn_qkv have the same shape: one attribution, both named.
        assert_eq!(
            attribute(&mmvq(12, false, false), [8192, 1, 1], [32, 4, 1], &t),
            Ok(Attribution {
                bytes: 8192 * Q4_K_ROW_2048,
                weights: "attn_q / attn_qkv".into()
            })
        );
        // small_k: each block covers blockDim.y rows (32 rows, 4 per block).
        assert_eq!(
            attribute(&mmvq(8, false, true), [8, 1, 1], [32, 4, 1], &t).map(|a| a.bytes),
            Ok(32 * 2048 / 32 * 34)
        );
        // The F32 router and the shared expert's 1-row gate vector through mmvf.
        assert_eq!(
            attribute(&mmvf("float"), [256, 1, 1], [128, 1, 1], &t),
            Ok(Attribution {
                bytes: 256 * 2048 * 4,
                weights: "ffn_gate_inp".into()
            })
        );
        assert_eq!(
            attribute(&mmvf("float"), [1, 1, 1], [128, 1, 1], &t),
            Ok(Attribution {
                bytes: 2048 * 4,
                weights: "ffn_gate_inp_shexp".into()
            })
        );
    }

    #[test]
    fn experts_are_read_once_per_channel_and_fusion_reads_the_gate_too() {
        let t = qwen36_layer();
        // 8 used experts of gate+up fused: 2 × 8 matrices of 512 rows.
        assert_eq!(
            attribute(&mmvq(12, true, false), [512, 8, 1], [32, 4, 1], &t),
            Ok(Attribution {
                bytes: 2 * 8 * 512 * Q4_K_ROW_2048,
                weights: "ffn_gate_exps / ffn_up_exps".into()
            })
        );
        // The same rows with one channel are the shared expert (2-D), not an expert; attn_k has
        // its shape too, but no partner to be fused with.
        assert_eq!(
            attribute(&mmvq(12, true, false), [512, 1, 1], [32, 4, 1], &t),
            Ok(Attribution {
                bytes: 2 * 512 * Q4_K_ROW_2048,
                weights: "ffn_gate_shexp / ffn_up_shexp".into()
            })
        );
        assert_eq!(
            attribute(&mmvq(12, false, false), [512, 1, 1], [32, 4, 1], &t),
            Ok(Attribution {
                bytes: 512 * Q4_K_ROW_2048,
                weights: "attn_k / ffn_gate_shexp / ffn_up_shexp".into()
            })
        );
        // A fused launch over a shape no two tensors of a layer share.
        assert!(
            attribute(&mmvq(12, true, false), [8192, 1, 1], [32, 4, 1], &t)
                .unwrap_err()
                .contains("no gate/up twins among its Q4_K weights with 8192 rows")
        );
        // Down projections: experts at 8 channels.
        assert_eq!(
            attribute(&mmvq(14, false, false), [2048, 8, 1], [32, 4, 1], &t).map(|a| a.bytes),
            Ok(8 * 2048 * 512 / 256 * 210)
        );
    }

    #[test]
    fn launches_that_cannot_be_told_say_why() {
        let mut t = qwen36_layer();
        let err = |name: &KernelName, grid, t: &[WeightTensor]| {
            attribute(name, grid, [32, 4, 1], t).unwrap_err()
        };
        assert_eq!(
            err(&mmvq(12, false, false), [777, 1, 1], &t),
            "the model has no Q4_K weights with 777 rows"
        );
        assert!(err(&mmvq(12, false, true), [7, 1, 1], &t).contains("≤ 28 rows"));
        // Two Q4_K tensors of 2048 rows with different row lengths.
        t.push(tensor("blk.1.odd.weight", 12, &[1024, 2048]));
        let ambiguous = err(&mmvq(12, false, false), [2048, 1, 1], &t);
        assert!(
            ambiguous.starts_with("ambiguous") && ambiguous.contains("attn_output, odd, ssm_out"),
            "{ambiguous}"
        );
        let mut batch = mmvq(12, false, false);
        batch.template_args.as_mut().unwrap()[1] = TemplateArg::Value(4);
        assert!(err(&batch, [8192, 1, 1], &t).contains("ncols_dst 4"));
        let unread = KernelName {
            path: vec!["mul_mat_vec_q".into()],
            template_args: None,
        };
        assert!(err(&unread, [8192, 1, 1], &t).contains("could not be read"));
        assert!(err(&mmvf("double"), [256, 1, 1], &t).contains("element type"));
        assert!(reads_weights(&mmvf("float")) && !reads_weights(&KernelName::parse("_Z3foov")));
    }

    #[test]
    fn roles_drop_the_layer_and_the_suffix() {
        assert_eq!(
            tensor("blk.12.ffn_up_exps.weight", 12, &[1]).role(),
            "ffn_up_exps"
        );
        assert_eq!(tensor("output.weight", 14, &[1]).role(), "output");
        assert_eq!(tensor("blk.0.ssm_a", 0, &[1]).role(), "ssm_a");
    }

    #[test]
    fn the_mangled_names_of_the_pin_attribute_end_to_end() {
        let t = qwen36_layer();
        let name = KernelName::parse(
            "_ZL13mul_mat_vec_qIL9ggml_type12ELi1ELb1ELb0ELb0EEvPKvS2_PKi31ggml_cuda_mm_fusion_args_devicePfj5uint3jjjS7_jjjS7_jjjj",
        );
        assert!(reads_weights(&name));
        assert_eq!(
            attribute(&name, [512, 8, 1], [32, 4, 1], &t).map(|a| a.bytes),
            Ok(2 * 8 * 512 * Q4_K_ROW_2048)
        );
        let f = KernelName::parse(
            "_Z13mul_mat_vec_fIffLi1ELi128ELb0ELb0EEvPKT_PKfPKi31ggml_cuda_mm_fusion_args_devicePfi5uint3iiiS9_iiiS9_iiii",
        );
        assert_eq!(
            attribute(&f, [256, 1, 1], [128, 1, 1], &t).map(|a| a.weights),
            Ok("ffn_gate_inp".into())
        );
    }
}
