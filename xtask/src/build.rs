//! `cargo xtask build`: prepare the host tree (fetch, patch, mount), configure with CMake and
//! build with Ninja.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use xshell::{cmd, Shell};

use crate::config::{Flavor, HostConfig};
use crate::project::{note, read_stamp, step, write_stamp, Project};
use crate::toolchain::{self, CudaChoice, DriverLibrary, Provision};
use crate::{host, patch};

#[derive(Debug, Args, Clone)]
pub struct BuildArgs {
    /// Which host (a folder under hosts/).
    #[arg(long, default_value = "llama.cpp")]
    pub host: String,
    /// CUDA architectures, comma-separated (90a = H100/H200, 100a = B200, 110a = Thor,
    /// 120a = RTX 50xx). Default: the host's default_archs. With the overlay only these four (the
    /// overlay's kernels are written for them; others are refused); --stock builds any.
    #[arg(long, value_delimiter = ',', value_name = "ARCHS")]
    pub arch: Vec<String>,
    /// Build the pinned tree as upstream has it, without patches or overlay.
    #[arg(long)]
    pub stock: bool,
    /// Build without CUDA (the CPU backend only).
    #[arg(long, conflicts_with = "arch")]
    pub cpu: bool,
    /// Targets to build, comma-separated. Default: the host's build targets.
    #[arg(long, value_delimiter = ',', value_name = "TARGETS")]
    pub targets: Vec<String>,
    /// Compile only the overlay's OBJECT library and the host files that hold the hooks (links
    /// nothing, so it works with a CUDA toolkit that has no driver library).
    #[arg(long, conflicts_with_all = ["stock", "cpu", "targets"])]
    pub overlay_only: bool,
    /// Use this local checkout, extracted tree or archive (.tar.xz, .tar.gz, .tar; e.g. from
    /// `host pack`) as the host source; it must match the pin.
    #[arg(long, value_name = "DIR|ARCHIVE")]
    pub host_src: Option<PathBuf>,
    /// Use the pinned CUDA toolkit of toolchains.toml (installed into .xtask/toolchains) even if
    /// this machine has its own: the same nvcc everywhere.
    #[arg(long, conflicts_with = "cpu")]
    pub pinned_cuda: bool,
    /// Discard local edits and unexported commits in the patched working tree.
    #[arg(long)]
    pub force: bool,
    /// Parallel build jobs (default: all cores).
    #[arg(long, short)]
    pub jobs: Option<usize>,
}

impl BuildArgs {
    /// A build of `host` with every option at its command-line default.
    pub fn new(host: &str) -> BuildArgs {
        BuildArgs {
            host: host.to_owned(),
            arch: Vec::new(),
            stock: false,
            cpu: false,
            targets: Vec::new(),
            overlay_only: false,
            host_src: None,
            pinned_cuda: false,
            force: false,
            jobs: None,
        }
    }
}

/// What a finished build produced.
#[derive(Debug)]
pub struct Built {
    pub build_dir: PathBuf,
    pub binaries: Vec<PathBuf>,
    /// Linked against the CUDA driver stub: the binaries run only where the NVIDIA driver is.
    pub driver_stub: bool,
}

/// The configure arguments a build directory was last configured with.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct ConfigureStamp {
    args: Vec<String>,
}

pub fn run(sh: &Shell, project: &Project, args: BuildArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let built = build(sh, project, &args)?;
    let seconds = started.elapsed().as_secs();
    println!("build directory: {}", built.build_dir.display());
    for binary in &built.binaries {
        println!("  {}", binary.display());
    }
    let what = if args.overlay_only {
        "the overlay compiled (--overlay-only: nothing linked)"
    } else {
        "build done"
    };
    println!("{what} in {}m{:02}s", seconds / 60, seconds % 60);
    // Repeated here, at the end where a user looks, from the note printed before configuring.
    if built.driver_stub {
        println!(
            "note: no NVIDIA driver on this machine: linked against the CUDA driver stub, these \
             binaries run only on a machine with the NVIDIA driver installed"
        );
    }
    Ok(())
}

/// The architectures the overlay's kernels are written for: `GGML_CUDA_FLASHRT_SUPPORTED_ARCHS`
/// in overlay/CMakeLists.txt, the one list the CMake build also uses.
pub fn overlay_archs(project: &Project) -> Result<Vec<String>> {
    let path = project.overlay_dir().join("CMakeLists.txt");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let archs = text.lines().find_map(|line| {
        line.trim()
            .strip_prefix("set(GGML_CUDA_FLASHRT_SUPPORTED_ARCHS")
            .and_then(|rest| rest.strip_suffix(')'))
            .map(|list| {
                list.split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
    });
    match archs {
        Some(archs) if !archs.is_empty() => Ok(archs),
        _ => bail!(
            "{} has no `set(GGML_CUDA_FLASHRT_SUPPORTED_ARCHS ...)` line listing the overlay's \
             architectures: restore it",
            path.display()
        ),
    }
}

/// Refuses architectures (CMake form, see [`normalize_arch`]) the overlay is not built for, as the
/// overlay's CMake maps them: `90`, `90a` and `90f` all mean its sm_90a kernels.
pub fn check_overlay_archs(supported: &[String], archs: &[String]) -> Result<()> {
    let unsupported: Vec<&str> = archs
        .iter()
        .map(String::as_str)
        .filter(|arch| {
            let digits: String = arch.chars().take_while(char::is_ascii_digit).collect();
            !supported.contains(&format!("{digits}a"))
        })
        .collect();
    if unsupported.is_empty() {
        return Ok(());
    }
    let sm = |archs: &[&str]| {
        archs
            .iter()
            .map(|a| format!("sm_{a}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let supported: Vec<&str> = supported.iter().map(String::as_str).collect();
    bail!(
        "the FlashRT overlay is not built for {}: its kernels are written for {} \
         (overlay/CMakeLists.txt). Pass one of those with --arch, or build the host without the \
         overlay, for any architecture, with `cargo xtask build --stock --arch {}`.",
        sm(&unsupported),
        sm(&supported),
        unsupported.join(",")
    )
}

/// Normalises an architecture as given by a user ("sm_90a", "90a", "90") to CMake's form
/// ("90a"). Plain Hopper/Blackwell numbers get the architecture-specific suffix the overlay needs.
pub fn normalize_arch(arch: &str) -> Result<String> {
    let trimmed = arch
        .trim()
        .trim_start_matches("sm_")
        .trim_start_matches("compute_");
    let digits: String = trimmed.chars().take_while(char::is_ascii_digit).collect();
    let suffix = &trimmed[digits.len()..];
    if digits.len() < 2 || !matches!(suffix, "" | "a" | "f") {
        bail!("unknown CUDA architecture {arch:?}: use e.g. 90a (H100/H200), 100a (B200), 110a (Thor), 120a (RTX 50xx)");
    }
    let number: u32 = digits.parse()?;
    Ok(if number >= 90 && suffix.is_empty() {
        format!("{number}a")
    } else {
        format!("{number}{suffix}")
    })
}

pub fn build_dir_name(host: &str, flavor: Flavor, archs: &[String], overlay_only: bool) -> String {
    let target = if archs.is_empty() {
        "cpu".to_owned()
    } else {
        archs
            .iter()
            .map(|a| format!("sm{a}"))
            .collect::<Vec<_>>()
            .join("+")
    };
    let suffix = if overlay_only { "-overlay" } else { "" };
    format!("{host}-{flavor}-{target}{suffix}")
}

pub fn build(sh: &Shell, project: &Project, args: &BuildArgs) -> Result<Built> {
    let host = project.host(&args.host)?;
    let flavor = if args.stock {
        Flavor::Stock
    } else {
        Flavor::Flashrt
    };
    let archs: Vec<String> = if args.cpu {
        Vec::new()
    } else if args.arch.is_empty() {
        host.build
            .default_archs
            .iter()
            .map(|a| normalize_arch(a))
            .collect::<Result<_>>()?
    } else {
        args.arch
            .iter()
            .map(|a| normalize_arch(a))
            .collect::<Result<_>>()?
    };
    if flavor == Flavor::Flashrt && !archs.is_empty() {
        check_overlay_archs(&overlay_archs(project)?, &archs)?;
    }
    let targets: Vec<String> = if args.overlay_only {
        std::iter::once(host.build.overlay_target.clone())
            .chain(host.build.hook_objects.iter().cloned())
            .collect()
    } else if args.targets.is_empty() {
        host.build.targets.clone()
    } else {
        args.targets.clone()
    };

    // Cheap checks first: a host with no source, then missing tools, fail before minutes of work.
    host::require_some_source(project, &host, args.host_src.as_deref())?;
    let tools = toolchain::build_tools(sh, project, Provision::Install)?;
    let cuda = if args.cpu {
        None
    } else {
        let choice = if args.pinned_cuda {
            CudaChoice::Pinned
        } else {
            CudaChoice::Machine
        };
        Some(toolchain::cuda(sh, project, Provision::Install, choice)?)
    };
    if let Some(cuda) = &cuda {
        if cuda.driver.is_none() && !args.overlay_only {
            bail!(
                "the CUDA toolkit at {} ({}) has neither the NVIDIA driver's libcuda.so.1 nor a \
                 lib/stubs/libcuda.so to link against. Install the driver or a full CUDA toolkit, \
                 or use --overlay-only to compile the overlay alone, or --cpu for a CPU build.",
                cuda.root.display(),
                cuda.nvcc.origin
            );
        }
    }

    let source = match flavor {
        Flavor::Stock => {
            host::ensure_pristine(sh, project, &host, args.host_src.as_deref())?;
            project.pristine_dir(&host.name)
        }
        Flavor::Flashrt => {
            patch::ensure_patched(sh, project, &host, args.host_src.as_deref(), args.force)?
        }
    };

    let build_dir = project.build_dir(&build_dir_name(
        &host.name,
        flavor,
        &archs,
        args.overlay_only,
    ));
    let mut defines = cmake_defines(&host, flavor, &archs);
    defines.push((
        "CMAKE_MAKE_PROGRAM".into(),
        tools.ninja.path.display().to_string(),
    ));
    if let Some(cuda) = &cuda {
        defines.push((
            "CMAKE_CUDA_COMPILER".into(),
            cuda.nvcc.path.display().to_string(),
        ));
        defines.push(("CUDAToolkit_ROOT".into(), cuda.root.display().to_string()));
        match cuda.system_include() {
            // CMAKE_CUDA_FLAGS is split at spaces: such a path cannot be passed through it.
            Some(include) if !include.to_string_lossy().contains(char::is_whitespace) => {
                defines.push((
                    "CMAKE_CUDA_FLAGS".into(),
                    format!("-isystem={}", include.display()),
                ));
            }
            _ => {}
        }
        match cuda.driver {
            Some(DriverLibrary::Installed) => {}
            Some(DriverLibrary::Stub) => {
                // As llama.cpp's own CUDA containers do: executables leave the driver's symbols
                // to the real libcuda.so.1 of the machine they run on.
                if !args.overlay_only {
                    note("linking against the CUDA driver stub: binaries run where the NVIDIA driver is installed");
                }
                defines.push((
                    "CMAKE_EXE_LINKER_FLAGS".into(),
                    "-Wl,--allow-shlib-undefined".into(),
                ));
            }
            None => {
                // Only for --overlay-only: ggml-cuda's VMM path is what needs libcuda at configure time.
                note("no libcuda here: configuring with GGML_CUDA_NO_VMM=ON (compile only)");
                defines.push(("GGML_CUDA_NO_VMM".into(), "ON".into()));
            }
        }
    }
    configure(sh, &tools.cmake.path, &source, &build_dir, &defines)?;

    let jobs = args
        .jobs
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(usize::from)
                .unwrap_or(2)
        })
        .to_string();
    step(format!(
        "building {} in {} ({} jobs)",
        targets.join(" "),
        build_dir.display(),
        jobs
    ));
    let cmake = &tools.cmake.path;
    let target_args = &targets;
    cmd!(
        sh,
        "{cmake} --build {build_dir} --parallel {jobs} --target {target_args...}"
    )
    .run()
    .with_context(|| {
        format!(
            "building {} in {} (rerun the same command to resume)",
            targets.join(" "),
            build_dir.display()
        )
    })?;

    let binaries = targets
        .iter()
        .map(|t| build_dir.join("bin").join(t))
        .filter(|p| p.is_file())
        .collect();
    Ok(Built {
        build_dir,
        binaries,
        driver_stub: !args.overlay_only
            && cuda.is_some_and(|c| c.driver == Some(DriverLibrary::Stub)),
    })
}

/// The -D entries for one build, in a stable order.
pub fn cmake_defines(host: &HostConfig, flavor: Flavor, archs: &[String]) -> Vec<(String, String)> {
    let mut defines: Vec<(String, String)> = host.cmake.defaults.clone().into_iter().collect();
    if archs.is_empty() {
        defines.extend(host.cmake.cpu.clone());
    } else {
        defines.extend(host.cmake.cuda.clone());
        defines.push((host.cmake.arch_option.clone(), archs.join(";")));
        // The stock tree has no such option; the patched tree gets it explicitly either way.
        if flavor == Flavor::Flashrt {
            defines.push((host.cmake.flashrt_option.clone(), "ON".into()));
        }
    }
    defines.extend(build_info_defines(host, flavor));
    defines
}

/// The host's build info from the pin: its short commit (`+flashrt` for the patched tree with the
/// overlay mounted) and release number. Left to the host when it has no pin or no such options.
fn build_info_defines(host: &HostConfig, flavor: Flavor) -> Vec<(String, String)> {
    let mut defines = Vec::new();
    let Some(rev) = &host.rev else {
        return defines;
    };
    if let Some(option) = &host.cmake.commit_option {
        let suffix = match flavor {
            Flavor::Flashrt => "+flashrt",
            Flavor::Stock => "",
        };
        defines.push((option.clone(), format!("{}{suffix}", &rev[..7])));
    }
    let number = host
        .release
        .as_deref()
        .and_then(|r| r.strip_prefix('b'))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if let (Some(option), Some(number)) = (&host.cmake.build_number_option, number) {
        defines.push((option.clone(), number.to_owned()));
    }
    defines
}

fn configure(
    sh: &Shell,
    cmake: &Path,
    source: &Path,
    build_dir: &Path,
    defines: &[(String, String)],
) -> Result<()> {
    let mut args: Vec<String> = vec![
        "-S".into(),
        source.display().to_string(),
        "-B".into(),
        build_dir.display().to_string(),
        "-G".into(),
        "Ninja".into(),
    ];
    args.extend(defines.iter().map(|(k, v)| format!("-D{k}={v}")));
    let stamp_path = build_dir.join("xtask-configure.json");
    let wanted = ConfigureStamp { args };
    if build_dir.join("CMakeCache.txt").is_file()
        && read_stamp::<ConfigureStamp>(&stamp_path).as_ref() == Some(&wanted)
    {
        return Ok(());
    }
    step(format!("configuring {}", build_dir.display()));
    // A configure that did not finish must not be mistaken for a finished one.
    if stamp_path.exists() {
        std::fs::remove_file(&stamp_path)?;
    }
    let cmd_args = &wanted.args;
    cmd!(sh, "{cmake} {cmd_args...}")
        .run()
        .with_context(|| format!("configuring {}", build_dir.display()))?;
    write_stamp(&stamp_path, &wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programmatic_defaults_equal_the_command_line_defaults() {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            args: BuildArgs,
        }
        let parsed = Wrap::parse_from(["build"]).args;
        assert_eq!(
            format!("{parsed:?}"),
            format!("{:?}", BuildArgs::new("llama.cpp"))
        );
    }

    #[test]
    fn arch_names_normalise_to_cmake_form() {
        assert_eq!(normalize_arch("sm_90a").unwrap(), "90a");
        assert_eq!(normalize_arch("90").unwrap(), "90a");
        assert_eq!(normalize_arch("120").unwrap(), "120a");
        assert_eq!(normalize_arch("86").unwrap(), "86");
        assert_eq!(normalize_arch("100f").unwrap(), "100f");
        for bad in ["", "sm_", "ampere", "90b", "9"] {
            assert!(normalize_arch(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn build_info_names_the_pin_and_the_overlay() {
        let hosts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hosts");
        let llama = HostConfig::load(&hosts.join("llama.cpp/host.toml")).unwrap();
        let rev = llama.rev.clone().unwrap();
        let value = |defines: &[(String, String)], key: &str| {
            defines
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let archs = ["90a".to_owned()];
        let flashrt = cmake_defines(&llama, Flavor::Flashrt, &archs);
        assert_eq!(
            value(&flashrt, "LLAMA_BUILD_COMMIT"),
            Some(format!("{}+flashrt", &rev[..7]))
        );
        let number = llama.release.as_deref().unwrap().trim_start_matches('b');
        assert_eq!(
            value(&flashrt, "LLAMA_BUILD_NUMBER").as_deref(),
            Some(number)
        );
        let stock = cmake_defines(&llama, Flavor::Stock, &[]);
        assert_eq!(
            value(&stock, "LLAMA_BUILD_COMMIT"),
            Some(rev[..7].to_owned())
        );
        // An unpinned host keeps its own build info.
        let jetson = HostConfig::load(&hosts.join("jetson-pi-edge/host.toml")).unwrap();
        let defines = cmake_defines(&jetson, Flavor::Flashrt, &archs);
        assert_eq!(value(&defines, "LLAMA_BUILD_COMMIT"), None);
    }

    #[test]
    fn overlay_archs_accept_their_plain_and_family_forms_only() {
        let supported: Vec<String> = ["90a", "120a"].map(String::from).to_vec();
        let check = |archs: &[&str]| {
            let archs: Vec<String> = archs.iter().map(|a| a.to_string()).collect();
            check_overlay_archs(&supported, &archs)
        };
        assert!(check(&["90a", "120a", "120f"]).is_ok());
        let err = format!("{:#}", check(&["90a", "100a", "75"]).unwrap_err());
        assert!(err.contains("not built for sm_100a, sm_75:"), "{err}");
        assert!(err.contains("written for sm_90a, sm_120a"), "{err}");
        assert!(err.contains("--stock --arch 100a,75"), "{err}");
    }

    #[test]
    fn build_dirs_differ_by_flavor_arch_and_scope() {
        let archs = vec!["90a".to_owned(), "120a".to_owned()];
        assert_eq!(
            build_dir_name("llama.cpp", Flavor::Flashrt, &archs, false),
            "llama.cpp-flashrt-sm90a+sm120a"
        );
        assert_eq!(
            build_dir_name("llama.cpp", Flavor::Stock, &[], false),
            "llama.cpp-stock-cpu"
        );
        assert_eq!(
            build_dir_name("llama.cpp", Flavor::Flashrt, &archs[..1], true),
            "llama.cpp-flashrt-sm90a-overlay"
        );
    }
}
