//! `cargo xtask synth`: random-weight GGUFs at real model shapes, for honest speed numbers where
//! real weights cannot be downloaded. Weights are written directly as quantized blocks (a
//! Q4_K_M-like mix), streamed to disk, the same bytes for the same seed.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use xshell::Shell;

use crate::gguf::{self, Header, TensorInfo, Value, ValueType};
use crate::host;
use crate::project::{note, step, Project};

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Model shape.
    #[arg(long, value_enum)]
    pub preset: Preset,
    /// Output file (default: .xtask/models/<preset>[-variant]-s<seed>.gguf).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Random seed: the same seed writes the same bytes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Fewer layers than the preset (quick checks).
    #[arg(long, value_name = "N")]
    pub layers: Option<u32>,
    /// Fewer experts than the preset (MoE presets; at least the number used per token).
    #[arg(long, value_name = "N")]
    pub experts: Option<u32>,
    /// Store the tensors whose name contains PATTERN as TYPE (f32, f16, q8_0, q4_k, q6_k), as
    /// llama-quantize's --tensor-type does; repeatable, the last match wins. E.g.
    /// `--tensor-type ffn_gate_inp_shexp=f16` for an unquantized checkpoint's gate.
    #[arg(long, value_name = "PATTERN=TYPE", value_parser = parse_tensor_type)]
    pub tensor_type: Vec<(String, Quant)>,
    /// Add one multi-token-prediction (NextN) layer after the trunk, as Qwen3.6 checkpoints
    /// have (qwen36-35b-a3b only). Decoding does not read it unless MTP drafting is asked for.
    #[arg(long)]
    pub mtp: bool,
    /// Weights scaled so that greedy outputs barely depend on rounding (the embedding dominates
    /// the residual stream; logits and router scores far apart): for comparing runs by their
    /// text, e.g. a server under load against one request at a time.
    #[arg(long)]
    pub stable: bool,
}

fn parse_tensor_type(text: &str) -> Result<(String, Quant)> {
    let (pattern, name) = text
        .split_once('=')
        .with_context(|| format!("{text:?}: use PATTERN=TYPE, e.g. ffn_gate_inp_shexp=f16"))?;
    let quant = match name.to_ascii_lowercase().as_str() {
        "f32" => Quant::F32,
        "f16" => Quant::F16,
        "q8_0" => Quant::Q8_0,
        "q4_k" => Quant::Q4K,
        "q6_k" => Quant::Q6K,
        other => bail!("{text:?}: unknown type {other:?} (f32, f16, q8_0, q4_k, q6_k)"),
    };
    if pattern.is_empty() {
        bail!("{text:?}: empty pattern");
    }
    Ok((pattern.to_owned(), quant))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// Qwen3.6-35B-A3B shape (qwen35moe): 40 layers, 3 of 4 Gated DeltaNet, 256 experts / 8 used.
    #[value(name = "qwen36-35b-a3b")]
    Qwen36_35bA3b,
    /// Qwen3-30B-A3B shape (qwen3moe): 48 layers, 128 experts / 8 used.
    #[value(name = "qwen3-30b-a3b")]
    Qwen3_30bA3b,
    /// A small dense Qwen3 (0.6B shape, 28 layers) for quick checks.
    #[value(name = "qwen3-0.6b")]
    Qwen3_0_6b,
}

// ---- ggml tensor types written here ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quant {
    F32,
    F16,
    Q8_0,
    Q4K,
    Q6K,
}

impl Quant {
    fn ggml_type(self) -> u32 {
        match self {
            Quant::F32 => 0,
            Quant::F16 => 1,
            Quant::Q8_0 => 8,
            Quant::Q4K => 12,
            Quant::Q6K => 14,
        }
    }
    /// (elements, bytes) per block.
    fn block(self) -> (u64, u64) {
        match self {
            Quant::F32 => (1, 4),
            Quant::F16 => (1, 2),
            Quant::Q8_0 => (32, 34),
            Quant::Q4K => (256, 144),
            Quant::Q6K => (256, 210),
        }
    }
}

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Init {
    /// Zero-mean weights with this standard deviation (quantized: approximately).
    Weight(f32),
    /// Norm weights: 1 plus a little noise.
    Norm,
    /// Uniform in [lo, hi).
    Uniform(f32, f32),
}

#[derive(Debug, Clone, PartialEq)]
struct Spec {
    name: String,
    dims: Vec<u64>,
    quant: Quant,
    init: Init,
    /// Expert weights: only n_used / n_expert of them are read per token.
    expert: bool,
    /// Part of a multi-token-prediction layer: not read by ordinary decoding.
    mtp: bool,
}

impl Spec {
    fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
    fn bytes(&self) -> u64 {
        let (per, bytes) = self.quant.block();
        self.elements() / per * bytes
    }
}

const WEIGHT_STD: f32 = 0.02;

fn spec(name: String, dims: &[u64], quant: Quant, init: Init) -> Spec {
    Spec {
        name,
        dims: dims.to_vec(),
        quant,
        init,
        expert: false,
        mtp: false,
    }
}

/// The shape of a preset, after --layers / --experts.
#[derive(Debug, Clone)]
pub struct Model {
    arch: &'static str,
    kv: Vec<(String, Value)>,
    tensors: Vec<Spec>,
    n_vocab: u64,
    n_expert: u64,
    n_expert_used: u64,
}

fn u32v(v: u64) -> Value {
    Value::U32(v as u32)
}

impl Model {
    pub fn build(
        preset: Preset,
        layers: Option<u32>,
        experts: Option<u32>,
        mtp: bool,
    ) -> Result<Model> {
        if mtp && preset != Preset::Qwen36_35bA3b {
            bail!("--mtp: only the qwen36-35b-a3b preset has a multi-token-prediction layer");
        }
        let m = match preset {
            Preset::Qwen36_35bA3b => qwen35moe(
                layers.unwrap_or(40).into(),
                experts.unwrap_or(256).into(),
                mtp,
            ),
            Preset::Qwen3_30bA3b => qwen3(
                true,
                layers.unwrap_or(48).into(),
                experts.unwrap_or(128).into(),
            ),
            Preset::Qwen3_0_6b => {
                if experts.is_some() {
                    bail!("--experts: preset qwen3-0.6b is dense");
                }
                qwen3(false, layers.unwrap_or(28).into(), 0)
            }
        };
        if m.n_expert > 0 && m.n_expert < m.n_expert_used {
            bail!(
                "--experts {}: fewer than the {} used per token",
                m.n_expert,
                m.n_expert_used
            );
        }
        Ok(m)
    }

    /// Rescales the weights so that greedy decoding does not hinge on rounding: the token
    /// embedding dominates the residual stream (std 1, while each layer's output projections are
    /// drawn at std 0.001), and the LM head's logits (std 0.3) and the router's scores (std 0.2)
    /// lie far apart. Batch composition and kernel choice then change few greedy tokens, so runs
    /// can be compared by their text.
    pub fn stabilize(&mut self) {
        for t in &mut self.tensors {
            if !matches!(t.init, Init::Weight(_)) {
                continue;
            }
            let name = t.name.as_str();
            let std = if name == "token_embd.weight" {
                1.0
            } else if name == "output.weight" {
                0.3
            } else if ["attn_output.", "ssm_out.", "ffn_down"]
                .iter()
                .any(|p| name.contains(p))
            {
                0.001
            } else if name.contains("ffn_gate_inp.") {
                0.2
            } else {
                continue;
            };
            t.init = Init::Weight(std);
        }
    }

    /// Stores the tensors matching each `(pattern, type)` as that type (the last match wins).
    pub fn override_types(&mut self, overrides: &[(String, Quant)]) -> Result<()> {
        for (pattern, quant) in overrides {
            let mut matched = false;
            for t in self
                .tensors
                .iter_mut()
                .filter(|t| t.name.contains(pattern.as_str()))
            {
                let (per, _) = quant.block();
                if t.dims[0] % per != 0 {
                    bail!(
                        "--tensor-type {pattern}={quant:?}: {} has rows of {} values, not whole {per}-value blocks",
                        t.name,
                        t.dims[0]
                    );
                }
                if !matches!(t.init, Init::Weight(_)) && !matches!(quant, Quant::F32 | Quant::F16) {
                    bail!("--tensor-type {pattern}={quant:?}: {} holds norms or constants, which stay F32 or F16", t.name);
                }
                t.quant = *quant;
                matched = true;
            }
            if !matched {
                bail!(
                    "--tensor-type {pattern}: no tensor of this preset has {pattern:?} in its name"
                );
            }
        }
        Ok(())
    }

    /// Bytes read per decoded token: every dense weight, the LM head, the used experts' share
    /// (the token embedding is one row; an MTP layer is not read).
    pub fn bytes_per_token(&self) -> f64 {
        let mut total = 0.0;
        for t in &self.tensors {
            if t.name == "token_embd.weight" || t.mtp {
                continue;
            }
            let bytes = t.bytes() as f64;
            total += if t.expert {
                bytes * self.n_expert_used as f64 / self.n_expert as f64
            } else {
                bytes
            };
        }
        total
    }

    pub fn file_bytes(&self) -> u64 {
        self.tensors.iter().map(Spec::bytes).sum()
    }
}

fn weight(name: String, dims: &[u64], quant: Quant) -> Spec {
    spec(name, dims, quant, Init::Weight(WEIGHT_STD))
}

fn norm(name: String, n: u64) -> Spec {
    spec(name, &[n], Quant::F32, Init::Norm)
}

/// token_embd, output_norm, output: the same for every preset.
fn embeddings_and_head(n_embd: u64, n_vocab: u64) -> Vec<Spec> {
    vec![
        weight("token_embd.weight".into(), &[n_embd, n_vocab], Quant::Q4K),
        norm("output_norm.weight".into(), n_embd),
        weight("output.weight".into(), &[n_embd, n_vocab], Quant::Q6K),
    ]
}

/// Full attention with q/k norms. `q_gated`: Q carries a gate half (qwen35moe).
struct Attention {
    n_head: u64,
    n_head_kv: u64,
    head_dim: u64,
    q_gated: bool,
}

impl Attention {
    fn push(&self, t: &mut Vec<Spec>, il: u64, n_embd: u64) {
        let b = |n: &str| format!("blk.{il}.{n}");
        let q_rows = self.head_dim * self.n_head * if self.q_gated { 2 } else { 1 };
        let kv_rows = self.head_dim * self.n_head_kv;
        t.push(weight(b("attn_q.weight"), &[n_embd, q_rows], Quant::Q4K));
        t.push(weight(b("attn_k.weight"), &[n_embd, kv_rows], Quant::Q4K));
        t.push(weight(b("attn_v.weight"), &[n_embd, kv_rows], Quant::Q6K));
        t.push(weight(
            b("attn_output.weight"),
            &[self.head_dim * self.n_head, n_embd],
            Quant::Q4K,
        ));
        t.push(norm(b("attn_q_norm.weight"), self.head_dim));
        t.push(norm(b("attn_k_norm.weight"), self.head_dim));
    }

    fn kv(&self, a: &str) -> Vec<(String, Value)> {
        vec![
            (format!("{a}.attention.head_count"), u32v(self.n_head)),
            (format!("{a}.attention.head_count_kv"), u32v(self.n_head_kv)),
            (format!("{a}.attention.key_length"), u32v(self.head_dim)),
            (format!("{a}.attention.value_length"), u32v(self.head_dim)),
            (
                format!("{a}.attention.layer_norm_rms_epsilon"),
                Value::F32(1e-6),
            ),
        ]
    }
}

/// The router and the routed experts of one layer (gate and up Q4_K, down Q6_K).
fn push_experts(t: &mut Vec<Spec>, il: u64, n_embd: u64, n_ff: u64, n_expert: u64) {
    let b = |n: &str| format!("blk.{il}.{n}");
    t.push(weight(
        b("ffn_gate_inp.weight"),
        &[n_embd, n_expert],
        Quant::F32,
    ));
    for (name, dims, quant) in [
        ("ffn_gate_exps.weight", [n_embd, n_ff, n_expert], Quant::Q4K),
        ("ffn_up_exps.weight", [n_embd, n_ff, n_expert], Quant::Q4K),
        ("ffn_down_exps.weight", [n_ff, n_embd, n_expert], Quant::Q6K),
    ] {
        t.push(Spec {
            expert: true,
            ..weight(b(name), &dims, quant)
        });
    }
}

/// The gated shared expert of a qwen35moe layer (its gate vector F32, as quantizers keep 1-row
/// tensors).
fn push_shared_expert(t: &mut Vec<Spec>, il: u64, n_embd: u64, n_ff: u64) {
    let b = |n: &str| format!("blk.{il}.{n}");
    t.push(weight(
        b("ffn_gate_inp_shexp.weight"),
        &[n_embd],
        Quant::F32,
    ));
    t.push(weight(
        b("ffn_gate_shexp.weight"),
        &[n_embd, n_ff],
        Quant::Q4K,
    ));
    t.push(weight(
        b("ffn_up_shexp.weight"),
        &[n_embd, n_ff],
        Quant::Q4K,
    ));
    t.push(weight(
        b("ffn_down_shexp.weight"),
        &[n_ff, n_embd],
        Quant::Q6K,
    ));
}

/// Qwen3.5/3.6 MoE (qwen35moe): every 4th layer full attention, the others Gated DeltaNet.
fn qwen35moe(n_layer: u64, n_expert: u64, mtp: bool) -> Model {
    let (n_embd, n_vocab, n_ff_exp, n_ff_shexp, n_used) =
        (2048u64, 248320u64, 512u64, 512u64, 8u64);
    let attn = Attention {
        n_head: 16,
        n_head_kv: 2,
        head_dim: 256,
        q_gated: true,
    };
    let (k_heads, v_heads, head_k, conv) = (16u64, 32u64, 128u64, 4u64);
    let (key_dim, value_dim) = (head_k * k_heads, head_k * v_heads);
    let a = "qwen35moe";
    let mut kv = vec![
        (format!("{a}.context_length"), u32v(262144)),
        (format!("{a}.embedding_length"), u32v(n_embd)),
        (format!("{a}.block_count"), u32v(n_layer + u64::from(mtp))),
        (format!("{a}.feed_forward_length"), u32v(n_ff_exp)),
        (format!("{a}.expert_feed_forward_length"), u32v(n_ff_exp)),
        (
            format!("{a}.expert_shared_feed_forward_length"),
            u32v(n_ff_shexp),
        ),
        (format!("{a}.expert_count"), u32v(n_expert)),
        (format!("{a}.expert_used_count"), u32v(n_used)),
        (format!("{a}.rope.dimension_count"), u32v(64)),
        (
            format!("{a}.rope.dimension_sections"),
            Value::Array(ValueType::I32, [11, 11, 10, 0].map(Value::I32).to_vec()),
        ),
        (format!("{a}.rope.freq_base"), Value::F32(1e7)),
        (format!("{a}.full_attention_interval"), u32v(4)),
        (format!("{a}.ssm.conv_kernel"), u32v(conv)),
        (format!("{a}.ssm.state_size"), u32v(head_k)),
        (format!("{a}.ssm.group_count"), u32v(k_heads)),
        (format!("{a}.ssm.time_step_rank"), u32v(v_heads)),
        (format!("{a}.ssm.inner_size"), u32v(value_dim)),
    ];
    kv.extend(attn.kv(a));
    if mtp {
        kv.push((format!("{a}.nextn_predict_layers"), u32v(1)));
    }
    let mut t = embeddings_and_head(n_embd, n_vocab);
    for il in 0..n_layer {
        let b = |n: &str| format!("blk.{il}.{n}");
        t.push(norm(b("attn_norm.weight"), n_embd));
        t.push(norm(b("post_attention_norm.weight"), n_embd));
        if (il + 1) % 4 == 0 {
            attn.push(&mut t, il, n_embd);
        } else {
            let conv_dim = key_dim * 2 + value_dim;
            t.push(weight(
                b("attn_qkv.weight"),
                &[n_embd, conv_dim],
                Quant::Q4K,
            ));
            t.push(weight(
                b("attn_gate.weight"),
                &[n_embd, value_dim],
                Quant::Q4K,
            ));
            t.push(spec(
                b("ssm_conv1d.weight"),
                &[conv, conv_dim],
                Quant::F32,
                Init::Uniform(-0.5, 0.5),
            ));
            t.push(spec(
                b("ssm_dt.bias"),
                &[v_heads],
                Quant::F32,
                Init::Uniform(-0.5, 0.5),
            ));
            // A = -exp(A_log): negative, so that the recurrent state decays.
            t.push(spec(
                b("ssm_a"),
                &[v_heads],
                Quant::F32,
                Init::Uniform(-16.0, -1.0),
            ));
            t.push(weight(
                b("ssm_beta.weight"),
                &[n_embd, v_heads],
                Quant::Q8_0,
            ));
            t.push(weight(
                b("ssm_alpha.weight"),
                &[n_embd, v_heads],
                Quant::Q8_0,
            ));
            t.push(norm(b("ssm_norm.weight"), head_k));
            t.push(weight(
                b("ssm_out.weight"),
                &[value_dim, n_embd],
                Quant::Q4K,
            ));
        }
        push_experts(&mut t, il, n_embd, n_ff_exp, n_expert);
        push_shared_expert(&mut t, il, n_embd, n_ff_shexp);
    }
    if mtp {
        // The NextN block: a full-attention MoE decoder layer plus the projection that joins the
        // trunk's hidden state with the next token's embedding.
        let il = n_layer;
        let b = |n: &str| format!("blk.{il}.{n}");
        let first = t.len();
        t.push(norm(b("attn_norm.weight"), n_embd));
        t.push(norm(b("post_attention_norm.weight"), n_embd));
        attn.push(&mut t, il, n_embd);
        push_experts(&mut t, il, n_embd, n_ff_exp, n_expert);
        push_shared_expert(&mut t, il, n_embd, n_ff_shexp);
        t.push(weight(
            b("nextn.eh_proj.weight"),
            &[2 * n_embd, n_embd],
            Quant::Q4K,
        ));
        t.push(norm(b("nextn.enorm.weight"), n_embd));
        t.push(norm(b("nextn.hnorm.weight"), n_embd));
        for spec in &mut t[first..] {
            spec.mtp = true;
        }
    }
    Model {
        arch: a,
        kv,
        tensors: t,
        n_vocab,
        n_expert,
        n_expert_used: n_used,
    }
}

/// Qwen3 (dense 0.6B shape) and Qwen3 MoE (30B-A3B shape).
fn qwen3(moe: bool, n_layer: u64, n_expert: u64) -> Model {
    let (a, n_embd, n_ff, n_used) = if moe {
        ("qwen3moe", 2048u64, 768u64, 8u64)
    } else {
        ("qwen3", 1024, 3072, 0)
    };
    let attn = if moe {
        Attention {
            n_head: 32,
            n_head_kv: 4,
            head_dim: 128,
            q_gated: false,
        }
    } else {
        Attention {
            n_head: 16,
            n_head_kv: 8,
            head_dim: 128,
            q_gated: false,
        }
    };
    let n_vocab = 151936u64;
    let mut kv = vec![
        (format!("{a}.context_length"), u32v(40960)),
        (format!("{a}.embedding_length"), u32v(n_embd)),
        (format!("{a}.block_count"), u32v(n_layer)),
        (
            format!("{a}.feed_forward_length"),
            u32v(if moe { 6144 } else { n_ff }),
        ),
        (format!("{a}.rope.freq_base"), Value::F32(1e6)),
    ];
    kv.extend(attn.kv(a));
    if moe {
        kv.push((format!("{a}.expert_feed_forward_length"), u32v(n_ff)));
        kv.push((format!("{a}.expert_count"), u32v(n_expert)));
        kv.push((format!("{a}.expert_used_count"), u32v(n_used)));
    }
    let mut t = embeddings_and_head(n_embd, n_vocab);
    for il in 0..n_layer {
        let b = |n: &str| format!("blk.{il}.{n}");
        t.push(norm(b("attn_norm.weight"), n_embd));
        attn.push(&mut t, il, n_embd);
        t.push(norm(b("ffn_norm.weight"), n_embd));
        if moe {
            push_experts(&mut t, il, n_embd, n_ff, n_expert);
        } else {
            t.push(weight(b("ffn_gate.weight"), &[n_embd, n_ff], Quant::Q4K));
            t.push(weight(b("ffn_up.weight"), &[n_embd, n_ff], Quant::Q4K));
            t.push(weight(b("ffn_down.weight"), &[n_ff, n_embd], Quant::Q6K));
        }
    }
    Model {
        arch: a,
        kv,
        tensors: t,
        n_vocab,
        n_expert,
        n_expert_used: n_used,
    }
}

// ---- random data ----

/// SplitMix64: small, fast, and the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, name: &str) -> Rng {
        // FNV-1a of the tensor name: each tensor its own stream, independent of order.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        Rng(seed ^ h)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// IEEE half from f32 (round to nearest even), for the block scales.
fn f16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7fff_ffff;
    if abs >= 0x4780_0000 {
        return sign | 0x7c00; // >= 65536: infinity
    }
    if abs < 0x3880_0000 {
        // Below 2^-14: a subnormal half, in units of 2^-24.
        return sign | (f32::from_bits(abs) * 16_777_216.0).round() as u16;
    }
    let exp = (abs >> 23) + 15 - 127;
    let mant = abs & 0x7f_ffff;
    let mut half = (exp << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && half & 1 == 1) {
        half += 1;
    }
    sign | half as u16
}

/// One block's bytes for a zero-mean weight of standard deviation `std`.
fn weight_block(quant: Quant, std: f32, rng: &mut Rng, out: &mut [u8]) {
    match quant {
        Quant::Q8_0 => {
            // y = d * q, q uniform in [-128, 127]: std of q is 73.9.
            out[..2].copy_from_slice(&f16_bits(std / 73.9).to_le_bytes());
            rng.fill(&mut out[2..34]);
        }
        Quant::Q4K => {
            // y = d * sc * q - dmin * m with q uniform in [0, 15] (mean 7.5, std 4.61) and every
            // sub-block scale and min 15: zero mean when dmin = 7.5 d.
            let d = std / (15.0 * 4.61);
            out[..2].copy_from_slice(&f16_bits(d).to_le_bytes());
            out[2..4].copy_from_slice(&f16_bits(7.5 * d).to_le_bytes());
            // 6-bit scales and mins packed as ggml's get_scale_min_k4 reads them (all < 16).
            out[4..8].fill(15);
            out[8..12].fill(15);
            out[12..16].fill(15 | (15 << 4));
            rng.fill(&mut out[16..144]);
        }
        Quant::Q6K => {
            // y = d * scale * (q - 32), q uniform in [0, 63] (std 18.47), every scale 8.
            rng.fill(&mut out[..192]);
            out[192..208].fill(8);
            out[208..210].copy_from_slice(&f16_bits(std / (8.0 * 18.47)).to_le_bytes());
        }
        Quant::F32 | Quant::F16 => unreachable!("float tensors are written value by value"),
    }
}

/// Streams one tensor's bytes to `w`.
fn write_tensor(w: &mut impl Write, t: &Spec, seed: u64) -> Result<()> {
    let mut rng = Rng::new(seed, &t.name);
    let (per, block_bytes) = t.quant.block();
    let blocks = t.elements() / per;
    const CHUNK_BLOCKS: u64 = 4096;
    let mut buf = vec![0u8; (CHUNK_BLOCKS * block_bytes) as usize];
    let mut done = 0;
    while done < blocks {
        let n = CHUNK_BLOCKS.min(blocks - done);
        let chunk = &mut buf[..(n * block_bytes) as usize];
        match (t.quant, t.init) {
            (Quant::F32 | Quant::F16, init) => {
                for v in chunk.chunks_mut(block_bytes as usize) {
                    let x = match init {
                        // Sum of 4 uniforms: close enough to normal for weights.
                        Init::Weight(std) => {
                            let s: f32 = (0..4).map(|_| rng.unit()).sum();
                            (s - 2.0) * std * 1.732
                        }
                        Init::Norm => 1.0 + 0.1 * (rng.unit() - 0.5),
                        Init::Uniform(lo, hi) => lo + (hi - lo) * rng.unit(),
                    };
                    if t.quant == Quant::F16 {
                        v.copy_from_slice(&f16_bits(x).to_le_bytes());
                    } else {
                        v.copy_from_slice(&x.to_le_bytes());
                    }
                }
            }
            (quant, Init::Weight(std)) => {
                for block in chunk.chunks_mut(block_bytes as usize) {
                    weight_block(quant, std, &mut rng, block);
                }
            }
            (quant, init) => bail!("{}: {init:?} values cannot be written as {quant:?}", t.name),
        }
        w.write_all(chunk)?;
        done += n;
    }
    let padding = gguf::align(t.bytes(), gguf::DEFAULT_ALIGNMENT) - t.bytes();
    w.write_all(&vec![0u8; padding as usize])?;
    Ok(())
}

/// The tokenizer metadata of a host vocabulary file, padded to `n_vocab` tokens.
fn tokenizer_kv(vocab_file: &Path, n_vocab: u64) -> Result<Vec<(String, Value)>> {
    let header = gguf::read_header(vocab_file)?;
    let mut kv: Vec<(String, Value)> = header
        .kv
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .collect();
    for (key, value) in kv.iter_mut() {
        let Value::Array(elem, items) = value else {
            continue;
        };
        let pad = |i: usize| match key.as_str() {
            "tokenizer.ggml.tokens" => Some(Value::String(format!("<|synth_pad_{i}|>"))),
            // 3 = control: never produced by the tokenizer from text.
            "tokenizer.ggml.token_type" => Some(Value::I32(3)),
            "tokenizer.ggml.scores" => Some(Value::F32(0.0)),
            _ => None,
        };
        if pad(0).is_none() {
            continue;
        }
        if items.len() as u64 > n_vocab {
            bail!(
                "{} has {} tokens, more than the preset's {n_vocab}",
                vocab_file.display(),
                items.len()
            );
        }
        let start = items.len();
        items.extend((start..n_vocab as usize).map(|i| pad(i).expect("checked above")));
        debug_assert!(items.iter().all(|v| v.value_type() == *elem));
    }
    if !kv.iter().any(|(k, _)| k == "tokenizer.ggml.tokens") {
        bail!("{} has no tokenizer.ggml.tokens", vocab_file.display());
    }
    Ok(kv)
}

/// The GGUF header of `model`: metadata, tokenizer, tensor infos with aligned offsets.
fn header(model: &Model, tokenizer: Vec<(String, Value)>, name: &str) -> Header {
    let mut kv = vec![
        (
            "general.architecture".to_owned(),
            Value::String(model.arch.to_owned()),
        ),
        ("general.name".to_owned(), Value::String(name.to_owned())),
        ("general.file_type".to_owned(), Value::U32(15)), // Q4_K_M
    ];
    kv.extend(model.kv.iter().cloned());
    kv.extend(tokenizer);
    let mut tensors: Vec<TensorInfo> = model
        .tensors
        .iter()
        .map(|t| TensorInfo {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ggml_type: t.quant.ggml_type(),
            offset: 0,
        })
        .collect();
    let sizes: Vec<u64> = model.tensors.iter().map(Spec::bytes).collect();
    gguf::layout(&mut tensors, &sizes);
    Header { kv, tensors }
}

/// Only the header (no tensor data): enough for tools that read metadata.
#[cfg(test)]
pub fn write_header_only(model: &Model, out: &Path) -> Result<()> {
    let mut bytes = Vec::new();
    gguf::write_header(&mut bytes, &header(model, Vec::new(), "header only"))?;
    std::fs::write(out, bytes)?;
    Ok(())
}

/// Writes `model` to `out` (through a temporary file: a stopped run leaves no partial model).
fn write_model(
    model: &Model,
    tokenizer: Vec<(String, Value)>,
    seed: u64,
    name: &str,
    out: &Path,
) -> Result<()> {
    let header = header(model, tokenizer, name);

    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let partial = out.with_extension("gguf.partial");
    let file = std::fs::File::create(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let mut w = BufWriter::with_capacity(8 << 20, file);
    gguf::write_header(&mut w, &header)?;
    let total = model.file_bytes();
    let mut written = 0u64;
    let mut last_report = 0u64;
    for t in &model.tensors {
        write_tensor(&mut w, t, seed).with_context(|| format!("writing {}", partial.display()))?;
        written += t.bytes();
        if written - last_report > (2 << 30) || written == total {
            note(format!(
                "{:.1} / {:.1} GiB",
                written as f64 / (1u64 << 30) as f64,
                total as f64 / (1u64 << 30) as f64
            ));
            last_report = written;
        }
    }
    w.flush()?;
    drop(w);
    std::fs::rename(&partial, out).with_context(|| format!("moving into {}", out.display()))?;
    Ok(())
}

fn preset_name(preset: Preset) -> String {
    preset
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

/// The preset's full-size model in .xtask/models, written first if missing.
pub fn ensure_model(sh: &Shell, project: &Project, preset: Preset, seed: u64) -> Result<PathBuf> {
    ensure(sh, project, preset, seed, false)
}

/// The same with `--stable` (greedy answers that hardly depend on batch composition).
pub fn ensure_stable_model(
    sh: &Shell,
    project: &Project,
    preset: Preset,
    seed: u64,
) -> Result<PathBuf> {
    ensure(sh, project, preset, seed, true)
}

fn ensure(
    sh: &Shell,
    project: &Project,
    preset: Preset,
    seed: u64,
    stable: bool,
) -> Result<PathBuf> {
    let out = project.work().join("models").join(format!(
        "{}-s{seed}{}.gguf",
        preset_name(preset),
        if stable { "-stable" } else { "" }
    ));
    if !out.is_file() {
        run(
            sh,
            project,
            SynthArgs {
                preset,
                out: Some(out.clone()),
                seed,
                layers: None,
                experts: None,
                tensor_type: Vec::new(),
                mtp: false,
                stable,
            },
        )?;
    }
    Ok(out)
}

pub fn run(sh: &Shell, project: &Project, args: SynthArgs) -> Result<()> {
    let mut model = Model::build(args.preset, args.layers, args.experts, args.mtp)?;
    if args.stable {
        model.stabilize();
    }
    model.override_types(&args.tensor_type)?;
    let name = preset_name(args.preset);
    let variant = format!(
        "{}{}{}{}{}",
        args.layers.map(|l| format!("-l{l}")).unwrap_or_default(),
        args.experts.map(|e| format!("-e{e}")).unwrap_or_default(),
        if args.mtp { "-mtp" } else { "" },
        if args.stable { "-stable" } else { "" },
        args.tensor_type
            .iter()
            .map(|(pattern, quant)| format!("-{pattern}.{quant:?}").to_lowercase())
            .collect::<String>()
    );
    let out = args.out.clone().unwrap_or_else(|| {
        project
            .work()
            .join("models")
            .join(format!("{name}{variant}-s{}.gguf", args.seed))
    });

    // The real Qwen tokenizer, from the pinned host tree.
    let llama = project.host("llama.cpp")?;
    host::ensure_pristine(sh, project, &llama, None)?;
    let vocab_name = if model.arch == "qwen35moe" {
        "ggml-vocab-qwen35.gguf"
    } else {
        "ggml-vocab-qwen2.gguf"
    };
    let vocab = project
        .pristine_dir("llama.cpp")
        .join("models")
        .join(vocab_name);
    let tokenizer = tokenizer_kv(&vocab, model.n_vocab)?;

    step(format!(
        "writing {} ({} tensors, {:.2} GiB, seed {}) to {}",
        name,
        model.tensors.len(),
        model.file_bytes() as f64 / (1u64 << 30) as f64,
        args.seed,
        out.display()
    ));
    write_model(
        &model,
        tokenizer,
        args.seed,
        &format!("{name}{variant} (random weights, seed {})", args.seed),
        &out,
    )?;
    println!("{}", out.display());
    println!(
        "bytes read per decoded token: {:.3} GB",
        model.bytes_per_token() / 1e9
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_tokenizer(dir: &Path, n: usize) -> PathBuf {
        let path = dir.join("vocab.gguf");
        let header = Header {
            kv: vec![
                ("general.architecture".into(), Value::String("qwen2".into())),
                ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
                (
                    "tokenizer.ggml.tokens".into(),
                    Value::strings((0..n).map(|i| format!("t{i}"))),
                ),
                (
                    "tokenizer.ggml.token_type".into(),
                    Value::Array(ValueType::I32, vec![Value::I32(1); n]),
                ),
                (
                    "tokenizer.ggml.merges".into(),
                    Value::strings(["t 0".to_owned()]),
                ),
            ],
            tensors: vec![],
        };
        let mut bytes = Vec::new();
        gguf::write_header(&mut bytes, &header).unwrap();
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn stable_rescales_only_embedding_head_router_and_output_projections() {
        let plain = Model::build(Preset::Qwen36_35bA3b, Some(4), Some(8), false).unwrap();
        let mut stable = Model::build(Preset::Qwen36_35bA3b, Some(4), Some(8), false).unwrap();
        stable.stabilize();
        let std_of =
            |m: &Model, name: &str| match m.tensors.iter().find(|t| t.name == name).unwrap().init {
                Init::Weight(std) => std,
                other => panic!("{name}: {other:?}"),
            };
        assert_eq!(std_of(&stable, "token_embd.weight"), 1.0);
        assert_eq!(std_of(&stable, "output.weight"), 0.3);
        assert_eq!(std_of(&stable, "blk.0.ssm_out.weight"), 0.001);
        assert_eq!(std_of(&stable, "blk.3.attn_output.weight"), 0.001);
        assert_eq!(std_of(&stable, "blk.1.ffn_down_exps.weight"), 0.001);
        assert_eq!(std_of(&stable, "blk.1.ffn_down_shexp.weight"), 0.001);
        assert_eq!(std_of(&stable, "blk.2.ffn_gate_inp.weight"), 0.2);
        // Everything else as drawn without --stable: inputs of the layers, norms, constants.
        let mut unchanged = 0;
        for (a, b) in plain.tensors.iter().zip(&stable.tensors) {
            let rescaled = a.name == "token_embd.weight"
                || a.name == "output.weight"
                || ["attn_output.", "ssm_out.", "ffn_down", "ffn_gate_inp."]
                    .iter()
                    .any(|p| a.name.contains(p));
            if !rescaled {
                assert_eq!(a.init, b.init, "{}", a.name);
                unchanged += 1;
            }
        }
        assert!(unchanged > 40, "{unchanged}");
        assert_eq!(
            std_of(&stable, "blk.2.ffn_gate_inp_shexp.weight"),
            WEIGHT_STD
        );
    }

    #[test]
    fn preset_shapes_and_bytes_per_token() {
        let m = Model::build(Preset::Qwen36_35bA3b, None, None, false).unwrap();
        assert_eq!(
            m.tensors
                .iter()
                .filter(|t| t.name.ends_with("ssm_a"))
                .count(),
            30
        );
        assert_eq!(
            m.tensors
                .iter()
                .filter(|t| t.name.ends_with("attn_q.weight"))
                .count(),
            10
        );
        let gib = m.file_bytes() as f64 / (1u64 << 30) as f64;
        assert!((19.0..22.0).contains(&gib), "{gib} GiB");
        let per_token = m.bytes_per_token() / 1e9;
        assert!((1.0..2.5).contains(&per_token), "{per_token} GB per token");
        for t in &m.tensors {
            let (per, _) = t.quant.block();
            assert_eq!(t.dims[0] % per, 0, "{} rows are not whole blocks", t.name);
        }
        assert!(Model::build(Preset::Qwen36_35bA3b, Some(2), Some(4), false).is_err());
        assert!(Model::build(Preset::Qwen3_0_6b, None, Some(8), false).is_err());

        // One NextN layer: block_count counts it, nextn_predict_layers names it, decoding skips it.
        let with_mtp = Model::build(Preset::Qwen36_35bA3b, None, None, true).unwrap();
        let kv = |m: &Model, key: &str| m.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        assert_eq!(kv(&with_mtp, "qwen35moe.block_count"), Some(Value::U32(41)));
        assert_eq!(
            kv(&with_mtp, "qwen35moe.nextn_predict_layers"),
            Some(Value::U32(1))
        );
        assert_eq!(kv(&m, "qwen35moe.nextn_predict_layers"), None);
        let mtp_names: Vec<&str> = with_mtp
            .tensors
            .iter()
            .filter(|t| t.mtp)
            .map(|t| t.name.as_str())
            .collect();
        assert!(mtp_names.iter().all(|n| n.starts_with("blk.40.")));
        for name in [
            "blk.40.nextn.eh_proj.weight",
            "blk.40.attn_q.weight",
            "blk.40.ffn_up_exps.weight",
        ] {
            assert!(mtp_names.contains(&name), "{name}");
        }
        assert!(with_mtp.file_bytes() > m.file_bytes());
        assert_eq!(with_mtp.bytes_per_token(), m.bytes_per_token());
        assert!(Model::build(Preset::Qwen3_0_6b, None, None, true).is_err());
    }

    #[test]
    fn tensor_type_overrides() {
        assert_eq!(
            parse_tensor_type("ffn_gate_inp_shexp=F16").unwrap(),
            ("ffn_gate_inp_shexp".to_owned(), Quant::F16)
        );
        assert!(parse_tensor_type("ffn_gate_inp_shexp").is_err());
        assert!(parse_tensor_type("x=q5_k").is_err());
        assert!(parse_tensor_type("=f16").is_err());

        let mut m = Model::build(Preset::Qwen36_35bA3b, Some(4), Some(8), false).unwrap();
        let before = m.file_bytes();
        m.override_types(&[("ffn_gate_inp_shexp".into(), Quant::F16)])
            .unwrap();
        let gates: Vec<Spec> = m
            .tensors
            .iter()
            .filter(|t| t.name.contains("ffn_gate_inp_shexp"))
            .cloned()
            .collect();
        assert_eq!(gates.len(), 4);
        assert!(gates.iter().all(|t| t.quant == Quant::F16));
        assert_eq!(before - m.file_bytes(), 4 * 2048 * 2);
        // Unknown names, quantized norms and partial blocks are refused.
        assert!(m.override_types(&[("no_such".into(), Quant::F16)]).is_err());
        assert!(m
            .override_types(&[("ssm_norm".into(), Quant::Q8_0)])
            .is_err());
        assert!(m.override_types(&[("ssm_a".into(), Quant::Q8_0)]).is_err());

        // F16 values are written as halves, two bytes each, readable back as ~N(0, 0.02).
        let gate = gates[0].clone();
        let mut bytes = Vec::new();
        write_tensor(&mut bytes, &gate, 3).unwrap();
        assert_eq!(bytes.len() as u64, padded(gate.bytes()));
        let values: Vec<f32> = bytes[..4096]
            .chunks(2)
            .map(|h| half_to_f32(u16::from_le_bytes([h[0], h[1]])))
            .collect();
        let std = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
        assert!((0.015..0.025).contains(&std), "std {std}");
    }

    fn padded(n: u64) -> u64 {
        gguf::align(n, gguf::DEFAULT_ALIGNMENT)
    }

    #[test]
    fn writes_a_readable_gguf_the_same_for_the_same_seed() {
        let dir = tempfile::tempdir().unwrap();
        let vocab = tiny_tokenizer(dir.path(), 10);
        let model = Model::build(Preset::Qwen3_0_6b, Some(1), None, false).unwrap();
        let write = |seed: u64, name: &str| {
            let out = dir.path().join(name);
            let tok = tokenizer_kv(&vocab, model.n_vocab).unwrap();
            write_model(&model, tok, seed, "t", &out).unwrap();
            out
        };
        let a = write(7, "a.gguf");
        let b = write(7, "b.gguf");
        let c = write(8, "c.gguf");
        let bytes = |p: &Path| std::fs::read(p).unwrap();
        assert_eq!(bytes(&a), bytes(&b));
        assert_ne!(bytes(&a), bytes(&c));

        let header = gguf::read_header(&a).unwrap();
        assert_eq!(
            header.get("general.architecture"),
            Some(&Value::String("qwen3".into()))
        );
        assert_eq!(header.get("qwen3.block_count"), Some(&Value::U32(1)));
        let Some(Value::Array(_, tokens)) = header.get("tokenizer.ggml.tokens") else {
            panic!("no tokens")
        };
        assert_eq!(tokens.len() as u64, model.n_vocab);
        assert_eq!(tokens[3], Value::String("t3".into()));
        assert_eq!(tokens[10], Value::String("<|synth_pad_10|>".into()));
        assert_eq!(header.tensors.len(), model.tensors.len());
        let last = header.tensors.last().unwrap();
        let data_start = bytes(&a).len() as u64
            - gguf::align(model.tensors.last().unwrap().bytes(), 32)
            - last.offset;
        assert_eq!(data_start % 32, 0);
        assert!(!dir.path().join("a.gguf.partial").exists());
    }

    #[test]
    fn q4k_blocks_have_the_intended_spread() {
        let mut rng = Rng::new(1, "t");
        let mut block = [0u8; 144];
        let (mut sum, mut sum2, mut n) = (0.0f64, 0.0f64, 0.0f64);
        for _ in 0..64 {
            weight_block(Quant::Q4K, 0.02, &mut rng, &mut block);
            let d = half_to_f32(u16::from_le_bytes([block[0], block[1]]));
            let dmin = half_to_f32(u16::from_le_bytes([block[2], block[3]]));
            for &byte in &block[16..] {
                for q in [byte & 15, byte >> 4] {
                    let y = (d * 15.0 * q as f32 - dmin * 15.0) as f64;
                    sum += y;
                    sum2 += y * y;
                    n += 1.0;
                }
            }
        }
        let mean = sum / n;
        let std = (sum2 / n - mean * mean).sqrt();
        assert!(mean.abs() < 0.002, "mean {mean}");
        assert!((0.017..0.023).contains(&std), "std {std}");
    }

    fn half_to_f32(h: u16) -> f32 {
        let exp = ((h >> 10) & 0x1f) as i32;
        let mant = (h & 0x3ff) as f32;
        let v = if exp == 0 {
            mant / 1024.0 * 2f32.powi(-14)
        } else {
            (1.0 + mant / 1024.0) * 2f32.powi(exp - 15)
        };
        if h & 0x8000 != 0 {
            -v
        } else {
            v
        }
    }

    #[test]
    fn half_conversion_rounds_to_nearest() {
        for x in [1.0f32, 0.5, 2.89e-4, 6.77e-5, 1e-7, 65504.0, 0.1] {
            let back = half_to_f32(f16_bits(x));
            let tol = if x < 6.1e-5 { 6e-8 } else { x * 1e-3 };
            assert!((back - x).abs() <= tol, "{x} -> {back}");
        }
    }
}
