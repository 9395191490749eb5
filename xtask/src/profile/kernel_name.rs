//! Kernel names as CUPTI reports them (Itanium-mangled, as nvcc and gcc emit them) reduced to
//! what a profile needs: a short family name and the function's template arguments. Only the
//! function's own name and template arguments are read; its parameter list is not.
//!
//! `_Z13mul_mat_vec_qIL9ggml_type12ELi1ELb0ELb0ELb0EEvPKv…` is `mul_mat_vec_q` with template
//! arguments 12, 1, 0, 0, 0; `_Z11k_bin_bcastIXadL_ZL6op_addffEEfffJEEv…` is the family
//! `k_bin_bcast<op_add>` (a function given as a template argument says what the kernel does).

/// One template argument of a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateArg {
    /// An integer, bool or enum value: 12 for `(ggml_type)12`, 1 for `true`, -3.
    Value(i64),
    /// A type as C++ spells it (`float`, `__half`, `int*`); `?` where the name is a back-reference.
    Type(String),
    /// A function given as an argument (k_bin_bcast's operator): its name.
    Function(String),
    /// Anything else (expressions, argument packs).
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelName {
    /// Namespaces and the function's name, without anonymous or compiler-internal namespaces.
    pub path: Vec<String>,
    /// None when the name is not mangled or its template arguments could not be read.
    pub template_args: Option<Vec<TemplateArg>>,
}

impl KernelName {
    /// Never fails: a name that is not mangled (or not understood) becomes its own family.
    pub fn parse(name: &str) -> KernelName {
        if let Some(rest) = name.strip_prefix("_Z") {
            let mut p = Parser {
                s: rest.as_bytes(),
                pos: 0,
            };
            p.eat(b'L');
            if let Some((path, args)) = p.name() {
                return KernelName {
                    path: visible(path),
                    template_args: args,
                };
            }
            return KernelName {
                path: vec![name.to_owned()],
                template_args: None,
            };
        }
        // Already demangled ("void foo<1>(int)") or a plain C name ("sm90_xmma_gemm_…").
        let head = name.split(['<', '(']).next().unwrap_or(name);
        let last = head.split_whitespace().last().unwrap_or(head);
        KernelName {
            path: visible(last.split("::").map(str::to_owned).collect()),
            template_args: None,
        }
    }

    /// The function's own name.
    pub fn function(&self) -> &str {
        self.path.last().map_or("", String::as_str)
    }

    /// The short name kernels are grouped by: the qualified name, template arguments dropped
    /// except functions (`k_bin_bcast<op_add>`, `unary_op_kernel<op_silu>`).
    pub fn family(&self) -> String {
        let mut family = self.path.join("::");
        let functions: Vec<&str> = self
            .template_args
            .iter()
            .flatten()
            .filter_map(|arg| match arg {
                TemplateArg::Function(f) => Some(f.as_str()),
                _ => None,
            })
            .collect();
        if !functions.is_empty() {
            family.push('<');
            family.push_str(&functions.join(", "));
            family.push('>');
        }
        family
    }
}

/// Drops the components a reader cannot act on: the anonymous namespace and nvcc's per-file
/// `_INTERNAL_…` namespaces.
fn visible(path: Vec<String>) -> Vec<String> {
    let kept: Vec<String> = path
        .iter()
        .filter(|c| !c.starts_with("_GLOBAL__N") && !c.starts_with("_INTERNAL"))
        .cloned()
        .collect();
    if kept.is_empty() {
        path
    } else {
        kept
    }
}

type NameAndArgs = (Vec<String>, Option<Vec<TemplateArg>>);

/// A cursor over the part of a mangled name after `_Z`. Every method returns None where the
/// grammar subset read here ends, and the caller falls back to the whole mangled name.
struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn peek_at(&self, ahead: usize) -> Option<u8> {
        self.s.get(self.pos + ahead).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn starts_with(&self, text: &str) -> bool {
        self.s[self.pos..].starts_with(text.as_bytes())
    }

    fn number(&mut self) -> Option<u64> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        std::str::from_utf8(&self.s[start..self.pos])
            .ok()?
            .parse()
            .ok()
    }

    /// `<length><identifier>`.
    fn source_name(&mut self) -> Option<String> {
        let len = usize::try_from(self.number()?).ok()?;
        let end = self.pos.checked_add(len)?;
        let id = std::str::from_utf8(self.s.get(self.pos..end)?).ok()?;
        self.pos = end;
        Some(id.to_owned())
    }

    /// `[0-9A-Z]*_`: the index of a substitution or template parameter.
    fn seq_id(&mut self) -> Option<()> {
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
        {
            self.pos += 1;
        }
        self.eat(b'_').then_some(())
    }

    /// The function's name and its template arguments (None when they could not be read).
    fn name(&mut self) -> Option<NameAndArgs> {
        let path = match self.peek()? {
            b'N' => {
                self.pos += 1;
                return self.nested_name();
            }
            b'S' if self.peek_at(1) == Some(b't') => {
                self.pos += 2;
                vec!["std".to_owned(), self.unqualified_name()?]
            }
            _ => vec![self.unqualified_name()?],
        };
        let args = if self.peek() == Some(b'I') {
            self.template_args()
        } else {
            Some(Vec::new())
        };
        Some((path, args))
    }

    /// After `N`: components up to `E`; template arguments belong to the last one.
    fn nested_name(&mut self) -> Option<NameAndArgs> {
        while matches!(self.peek(), Some(b'r' | b'V' | b'K')) {
            self.pos += 1;
        }
        if matches!(self.peek(), Some(b'R' | b'O')) {
            self.pos += 1;
        }
        let mut path = Vec::new();
        let mut args = Some(Vec::new());
        loop {
            match self.peek()? {
                b'E' => {
                    self.pos += 1;
                    return Some((path, args));
                }
                b'I' => args = self.template_args(),
                b'S' => path.push(self.substitution()?),
                b'T' => {
                    self.pos += 1;
                    self.seq_id()?;
                    path.push("?".to_owned());
                }
                // Internal linkage of a component.
                b'L' => self.pos += 1,
                _ => {
                    path.push(self.unqualified_name()?);
                    args = Some(Vec::new());
                }
            }
            if args.is_none() {
                // Template arguments that could not be read: the end of the name is unknown.
                return Some((path, None));
            }
        }
    }

    fn unqualified_name(&mut self) -> Option<String> {
        match self.peek()? {
            b'0'..=b'9' => self.source_name(),
            b'C' if matches!(self.peek_at(1), Some(b'1'..=b'5')) => {
                self.pos += 2;
                Some("{constructor}".to_owned())
            }
            b'D' if matches!(self.peek_at(1), Some(b'0'..=b'5')) => {
                self.pos += 2;
                Some("{destructor}".to_owned())
            }
            b'U' if self.peek_at(1) == Some(b't') => {
                self.pos += 2;
                self.number();
                self.eat(b'_').then(|| "{unnamed}".to_owned())
            }
            b'U' if self.peek_at(1) == Some(b'l') => {
                // Ul <parameter types> E [<number>] _
                self.pos += 2;
                while !self.eat(b'E') {
                    self.type_name()?;
                }
                self.number();
                self.eat(b'_').then(|| "{lambda}".to_owned())
            }
            c if c.is_ascii_lowercase() => {
                let op = std::str::from_utf8(self.s.get(self.pos..self.pos + 2)?).ok()?;
                self.pos += 2;
                Some(format!("operator{op}"))
            }
            _ => None,
        }
    }

    /// At `I`: the arguments up to the matching `E`.
    fn template_args(&mut self) -> Option<Vec<TemplateArg>> {
        if !self.eat(b'I') {
            return None;
        }
        let mut args = Vec::new();
        while !self.eat(b'E') {
            args.push(self.template_arg()?);
        }
        Some(args)
    }

    fn template_arg(&mut self) -> Option<TemplateArg> {
        if self.starts_with("L_Z") {
            self.pos += 3;
            let function = self.function_reference()?;
            return self.eat(b'E').then_some(function);
        }
        if self.starts_with("XadL_Z") {
            self.pos += 6;
            let function = self.function_reference()?;
            return (self.eat(b'E') && self.eat(b'E')).then_some(function);
        }
        match self.peek()? {
            b'L' => {
                self.pos += 1;
                self.type_name()?;
                let start = self.pos;
                while self.peek()? != b'E' {
                    self.pos += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.pos]).ok()?;
                self.pos += 1;
                Some(
                    match text.strip_prefix('n') {
                        Some(negative) => negative.parse::<i64>().map(|v| TemplateArg::Value(-v)),
                        None => text.parse::<i64>().map(TemplateArg::Value),
                    }
                    .unwrap_or(TemplateArg::Other),
                )
            }
            b'J' => {
                self.pos += 1;
                while !self.eat(b'E') {
                    self.template_arg()?;
                }
                Some(TemplateArg::Other)
            }
            b'X' => None,
            _ => self.type_name().map(TemplateArg::Type),
        }
    }

    /// After `_Z` inside a template argument: a function's encoding (name and parameter types),
    /// up to but not including the `E` that closes the reference.
    fn function_reference(&mut self) -> Option<TemplateArg> {
        self.eat(b'L');
        let (path, _) = self.name()?;
        while self.peek()? != b'E' {
            self.type_name()?;
        }
        Some(TemplateArg::Function(visible(path).last()?.clone()))
    }

    /// At `S`: a back-reference or one of the std abbreviations.
    fn substitution(&mut self) -> Option<String> {
        self.pos += 1;
        let std_name = match self.peek()? {
            b't' => {
                self.pos += 1;
                return Some("std".to_owned());
            }
            b'a' => "std::allocator",
            b'b' => "std::basic_string",
            b's' => "std::string",
            b'i' => "std::istream",
            b'o' => "std::ostream",
            b'd' => "std::iostream",
            _ => {
                self.seq_id()?;
                return Some("?".to_owned());
            }
        };
        self.pos += 1;
        Some(std_name.to_owned())
    }

    /// One type, spelled roughly as C++ would.
    fn type_name(&mut self) -> Option<String> {
        let c = self.peek()?;
        let builtin = match c {
            b'v' => Some("void"),
            b'w' => Some("wchar_t"),
            b'b' => Some("bool"),
            b'c' => Some("char"),
            b'a' => Some("signed char"),
            b'h' => Some("unsigned char"),
            b's' => Some("short"),
            b't' => Some("unsigned short"),
            b'i' => Some("int"),
            b'j' => Some("unsigned int"),
            b'l' => Some("long"),
            b'm' => Some("unsigned long"),
            b'x' => Some("long long"),
            b'y' => Some("unsigned long long"),
            b'n' => Some("__int128"),
            b'o' => Some("unsigned __int128"),
            b'f' => Some("float"),
            b'd' => Some("double"),
            b'e' => Some("long double"),
            b'g' => Some("__float128"),
            b'z' => Some("..."),
            _ => None,
        };
        if let Some(name) = builtin {
            self.pos += 1;
            return Some(name.to_owned());
        }
        self.pos += 1;
        let with_args = |p: &mut Self, name: String| -> Option<String> {
            if p.peek() == Some(b'I') {
                p.template_args()?;
            }
            Some(name)
        };
        match c {
            b'P' => Some(format!("{}*", self.type_name()?)),
            b'R' => Some(format!("{}&", self.type_name()?)),
            b'O' => Some(format!("{}&&", self.type_name()?)),
            b'K' => Some(format!("{} const", self.type_name()?)),
            b'V' => Some(format!("{} volatile", self.type_name()?)),
            b'r' | b'C' | b'G' => self.type_name(),
            b'u' => self.source_name(),
            b'0'..=b'9' => {
                self.pos -= 1;
                let name = self.source_name()?;
                with_args(self, name)
            }
            b'N' => {
                let (path, args) = self.nested_name()?;
                args?;
                Some(path.last()?.clone())
            }
            b'S' => {
                self.pos -= 1;
                let name = if self.starts_with("St") {
                    self.pos += 2;
                    format!("std::{}", self.unqualified_name()?)
                } else {
                    self.substitution()?
                };
                with_args(self, name)
            }
            b'T' => {
                self.seq_id()?;
                with_args(self, "?".to_owned())
            }
            b'F' => {
                self.eat(b'Y');
                loop {
                    if self.eat(b'E') {
                        break;
                    }
                    if matches!(self.peek()?, b'R' | b'O') && self.peek_at(1) == Some(b'E') {
                        self.pos += 2;
                        break;
                    }
                    self.type_name()?;
                }
                Some("function".to_owned())
            }
            b'A' => {
                self.number();
                self.eat(b'_').then_some(())?;
                Some(format!("{}[]", self.type_name()?))
            }
            b'M' => {
                self.type_name()?;
                self.type_name()
            }
            b'D' => {
                let d = self.peek()?;
                self.pos += 1;
                match d {
                    b'h' => Some("half".to_owned()),
                    b'n' => Some("decltype(nullptr)".to_owned()),
                    b'a' | b'c' => Some("auto".to_owned()),
                    b'i' => Some("char32_t".to_owned()),
                    b's' => Some("char16_t".to_owned()),
                    b'u' => Some("char8_t".to_owned()),
                    b'F' => {
                        let bits = self.number()?;
                        if self.eat(b'b') {
                            Some("bfloat16".to_owned())
                        } else {
                            self.eat(b'_').then(|| format!("_Float{bits}"))
                        }
                    }
                    b'p' => self.type_name(),
                    b'v' => {
                        self.number()?;
                        self.eat(b'_').then_some(())?;
                        Some(format!("vector of {}", self.type_name()?))
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TemplateArg::*;

    // Mangled names written by g++ for declarations shaped like ggml-cuda's and the overlay's
    // kernels (nvcc mangles device functions the same way); c++filt's reading in the comments.

    #[test]
    fn ggml_matvec_kernels_keep_their_template_arguments() {
        // void mul_mat_vec_q<(ggml_type)12, 1, false, false, false>(void const*, …)
        let q = KernelName::parse(
            "_Z13mul_mat_vec_qIL9ggml_type12ELi1ELb0ELb0ELb0EEvPKvS2_PKi31ggml_cuda_mm_fusion_args_devicePfj5uint3jjjS7_jjjS7_jjjj",
        );
        assert_eq!(q.path, ["mul_mat_vec_q"]);
        assert_eq!(
            q.template_args,
            Some(vec![Value(12), Value(1), Value(0), Value(0), Value(0)])
        );
        assert_eq!(q.family(), "mul_mat_vec_q");
        // mul_mat_vec_q<(ggml_type)14, 1, true, true, false>, internal linkage (static)
        let q6 = KernelName::parse(
            "_ZL13mul_mat_vec_qIL9ggml_type14ELi1ELb1ELb1ELb0EEvPKvS2_PKi31ggml_cuda_mm_fusion_args_devicePfj5uint3jjjS7_jjjS7_jjjj",
        );
        assert_eq!(
            q6.template_args,
            Some(vec![Value(14), Value(1), Value(1), Value(1), Value(0)])
        );
        // mul_mat_vec_f<__half, float, 1, 256, true, false>
        let f = KernelName::parse(
            "_Z13mul_mat_vec_fI6__halffLi1ELi256ELb1ELb0EEvPKT_PKfPKi31ggml_cuda_mm_fusion_args_devicePfi5uint3iiiSA_iiiSA_iiii",
        );
        assert_eq!(f.family(), "mul_mat_vec_f");
        assert_eq!(
            f.template_args,
            Some(vec![
                Type("__half".into()),
                Type("float".into()),
                Value(1),
                Value(256),
                Value(1),
                Value(0)
            ])
        );
        // flash_attn_ext_vec<256, 1, (ggml_type)0, (ggml_type)0, false>: the second enum
        // literal's type is a back-reference (LS0_0E).
        let fa =
            KernelName::parse("_Z18flash_attn_ext_vecILi256ELi1EL9ggml_type0ELS0_0ELb0EEvPKcS2_f");
        assert_eq!(
            fa.template_args,
            Some(vec![Value(256), Value(1), Value(0), Value(0), Value(0)])
        );
        assert_eq!(
            KernelName::parse("_Z10neg_kernelILin3EEvi").template_args,
            Some(vec![Value(-3)])
        );
    }

    #[test]
    fn function_arguments_name_the_family() {
        // k_bin_bcast<&(op_add(float, float)), float, float, float> with an empty pack
        let add =
            KernelName::parse("_Z11k_bin_bcastIXadL_ZL6op_addffEEfffJEEvPKT0_PKT1_PT2_5uint3DpT3_");
        assert_eq!(add.family(), "k_bin_bcast<op_add>");
        assert_eq!(
            add.template_args,
            Some(vec![
                Function("op_add".into()),
                Type("float".into()),
                Type("float".into()),
                Type("float".into()),
                Other
            ])
        );
        // … and a pack of one pointer type (JPKfE)
        let fused = KernelName::parse(
            "_Z11k_bin_bcastIXadL_ZL6op_addffEEfffJPKfEEvPKT0_PKT1_PT2_5uint3DpT3_",
        );
        assert_eq!(fused.family(), "k_bin_bcast<op_add>");
        // unary_op_kernel<&(op_silu(float)), float>
        let silu = KernelName::parse("_Z15unary_op_kernelIXadL_ZL7op_silufEEfEvPKT0_PS0_i");
        assert_eq!(silu.family(), "unary_op_kernel<op_silu>");
    }

    #[test]
    fn families_drop_templates_and_internal_namespaces() {
        for (mangled, family) in [
            (
                "_Z12rms_norm_f32ILi256ELb1ELb0ELb0EEvPKfPfil",
                "rms_norm_f32",
            ),
            (
                "_Z20gated_delta_net_cudaILi128ELb0ELb1EEvPKfPfl",
                "gated_delta_net_cuda",
            ),
            // frt_gated_rms_norm_f32_kernel(frt_gated_rms_norm_args), static
            (
                "_ZL29frt_gated_rms_norm_f32_kernel23frt_gated_rms_norm_args",
                "frt_gated_rms_norm_f32_kernel",
            ),
            // (anonymous namespace)::anon_kernel(int)
            ("_ZN12_GLOBAL__N_111anon_kernelEi", "anon_kernel"),
            // cub::CUB_300::DeviceReduceKernel<int*, float*>
            (
                "_ZN3cub7CUB_30018DeviceReduceKernelIPiPfEEvT_T0_",
                "cub::CUB_300::DeviceReduceKernel",
            ),
            // cutlass::Kernel<GemmOp>(GemmOp::Params)
            (
                "_ZN7cutlass6KernelI6GemmOpEEvNT_6ParamsE",
                "cutlass::Kernel",
            ),
            // nvcc's per-file namespace for internal-linkage device functions
            (
                "_ZN38_INTERNAL_5c1a2b3d_11_norm_cu_a1b2c3d412rms_norm_f32ILi256EEEvPKf",
                "rms_norm_f32",
            ),
            // not mangled: C names and names already demangled
            (
                "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n",
                "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n",
            ),
            (
                "void mul_mat_vec_q<(ggml_type)12, 1, false>(void const*, int)",
                "mul_mat_vec_q",
            ),
        ] {
            assert_eq!(KernelName::parse(mangled).family(), family, "{mangled}");
        }
        let cub = KernelName::parse("_ZN3cub7CUB_30018DeviceReduceKernelIPiPfEEvT_T0_");
        assert_eq!(
            cub.template_args,
            Some(vec![Type("int*".into()), Type("float*".into())])
        );
        assert_eq!(cub.function(), "DeviceReduceKernel");
    }

    #[test]
    fn what_is_not_understood_stays_whole_and_without_arguments() {
        // A template argument that is an expression other than a function's address.
        let odd = KernelName::parse("_Z3fooIXplLi1ELi2EEEvv");
        assert_eq!(odd.family(), "foo");
        assert_eq!(odd.template_args, None);
        // Cut short.
        let cut = "_Z13mul_mat_vec_qIL9ggml_type12ELi1";
        let k = KernelName::parse(cut);
        assert_eq!(
            (k.family(), k.template_args),
            ("mul_mat_vec_q".into(), None)
        );
        // A length that runs past the end.
        assert_eq!(KernelName::parse("_Z99short").family(), "_Z99short");
        assert_eq!(KernelName::parse("_Z").family(), "_Z");
    }
}
