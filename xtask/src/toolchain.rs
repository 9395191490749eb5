//! Finding cmake, ninja and nvcc, and installing pinned ones (toolchains.toml) into
//! .xtask/toolchains when a machine has none.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use crate::config::PipToolchain;
use crate::fsutil;
use crate::project::{note, step, Project};

/// A tool and where it came from, for messages and `doctor`.
#[derive(Debug, Clone)]
pub struct Tool {
    pub path: PathBuf,
    pub origin: &'static str,
}

#[derive(Debug, Clone)]
pub struct BuildTools {
    pub cmake: Tool,
    pub ninja: Tool,
}

#[derive(Debug, Clone)]
pub struct Cuda {
    pub nvcc: Tool,
    /// The toolkit root (bin/, include/, lib/).
    pub root: PathBuf,
    /// What ggml-cuda's driver-API calls can be linked against.
    pub driver: Option<DriverLibrary>,
}

impl Cuda {
    /// The toolkit's include folder, to be passed to nvcc as a system include (-isystem) so that
    /// warnings in its headers (cuda_fp4.hpp's unused parameters) are not reported for every file:
    /// nvcc's own profile adds it with a plain -I, and only targets linked to CUDA::cudart get it
    /// as a system folder from CMake. None where it is the compiler's default system folder
    /// already (`-isystem /usr/include` breaks libstdc++'s #include_next).
    pub fn system_include(&self) -> Option<PathBuf> {
        let include = self.root.join("include");
        let default_dirs = [Path::new("/usr/include"), Path::new("/usr/local/include")];
        let canonical = include.canonicalize().ok()?;
        (!default_dirs.contains(&canonical.as_path())).then_some(canonical)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverLibrary {
    /// The NVIDIA driver's libcuda.so.1 is installed: binaries link and run here.
    Installed,
    /// Only a link stub (a toolkit's lib/stubs/libcuda.so): binaries link, with executables
    /// allowed to leave the driver's symbols to run time, and run where a driver is installed.
    Stub,
}

/// Version of what xtask adds to a pip toolchain after installing it (symlinks, driver stub).
const TOOLCHAIN_LAYOUT: u32 = 2;

/// What may be done when a tool is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provision {
    /// Install the pinned toolchain into .xtask/toolchains.
    Install,
    /// Only look.
    LookOnly,
}

pub fn build_tools(sh: &Shell, project: &Project, provision: Provision) -> Result<BuildTools> {
    let on_path = |name: &str| {
        which::which(name).ok().map(|path| Tool {
            path,
            origin: "PATH",
        })
    };
    let (cmake, ninja) = (on_path("cmake"), on_path("ninja"));
    if let (Some(cmake), Some(ninja)) = (&cmake, &ninja) {
        return Ok(BuildTools {
            cmake: cmake.clone(),
            ninja: ninja.clone(),
        });
    }
    // Only the missing tool comes from the pinned install.
    let pins = project.toolchains()?.cmake;
    let dir = pip_toolchain(sh, project, &pins, "cmake and ninja", provision)?;
    let pinned = |name: &str| -> Result<Tool> {
        let rel = pins
            .tools
            .get(name)
            .with_context(|| format!("toolchains.toml [cmake] names no {name}"))?;
        Ok(Tool {
            path: dir.join(rel),
            origin: "xtask toolchain",
        })
    };
    Ok(BuildTools {
        cmake: cmake.map_or_else(|| pinned("cmake"), Ok)?,
        ninja: ninja.map_or_else(|| pinned("ninja"), Ok)?,
    })
}

/// Which CUDA toolkit a build uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CudaChoice {
    /// The machine's own (PATH, $CUDA_HOME, /usr/local/cuda), else the pinned one.
    #[default]
    Machine,
    /// Always the pinned toolkit of toolchains.toml: the same nvcc on every machine.
    Pinned,
}

/// nvcc from PATH, $CUDA_HOME, /usr/local/cuda, or the pinned pip toolkit.
pub fn cuda(
    sh: &Shell,
    project: &Project,
    provision: Provision,
    choice: CudaChoice,
) -> Result<Cuda> {
    let mut candidates: Vec<(PathBuf, &'static str)> = Vec::new();
    if choice == CudaChoice::Pinned {
        return pinned_cuda(sh, project, provision);
    }
    if let Ok(path) = which::which("nvcc") {
        candidates.push((path, "PATH"));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            candidates.push((Path::new(&home).join("bin/nvcc"), "CUDA_HOME"));
        }
    }
    candidates.push((PathBuf::from("/usr/local/cuda/bin/nvcc"), "/usr/local/cuda"));
    for (nvcc, origin) in candidates {
        if nvcc.is_file() {
            let nvcc = nvcc.canonicalize().unwrap_or(nvcc);
            let root = nvcc
                .parent()
                .and_then(Path::parent)
                .context("nvcc has no toolkit root")?
                .to_path_buf();
            return Ok(Cuda {
                nvcc: Tool { path: nvcc, origin },
                driver: driver_library(&root),
                root,
            });
        }
    }
    pinned_cuda(sh, project, provision)
}

fn pinned_cuda(sh: &Shell, project: &Project, provision: Provision) -> Result<Cuda> {
    let pins = project.toolchains()?.cuda;
    let dir = pip_toolchain(sh, project, &pins, "the CUDA toolkit (nvcc)", provision)?;
    let nvcc = dir.join(
        pins.tools
            .get("nvcc")
            .context("toolchains.toml [cuda] names no nvcc")?,
    );
    let root = dir.join(
        pins.root
            .as_deref()
            .context("toolchains.toml [cuda] has no root")?,
    );
    Ok(Cuda {
        nvcc: Tool {
            path: nvcc,
            origin: "xtask toolchain",
        },
        driver: driver_library(&root),
        root,
    })
}

fn driver_library(root: &Path) -> Option<DriverLibrary> {
    let system = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/local/nvidia/lib64",
        "/usr/lib/aarch64-linux-gnu",
    ];
    if system
        .iter()
        .any(|d| Path::new(d).join("libcuda.so.1").exists())
    {
        return Some(DriverLibrary::Installed);
    }
    let stubs = [root.join("lib64/stubs"), root.join("lib/stubs")];
    stubs
        .iter()
        .any(|d| d.join("libcuda.so").exists())
        .then_some(DriverLibrary::Stub)
}

/// The pinned pip toolchain's directory, installed first if allowed.
fn pip_toolchain(
    sh: &Shell,
    project: &Project,
    pins: &PipToolchain,
    what: &str,
    provision: Provision,
) -> Result<PathBuf> {
    let dir = project.toolchains_dir().join(&pins.dir);
    // The marker names the packages and how xtask laid them out: a change to either reinstalls.
    let marker = format!("layout {TOOLCHAIN_LAYOUT}\n{}\n", pins.packages.join("\n"));
    let complete = dir.join(".complete");
    if std::fs::read_to_string(&complete).is_ok_and(|m| m == marker) {
        return Ok(dir);
    }
    if provision == Provision::LookOnly {
        bail!("{what} not found (looked on PATH and in {})", dir.display());
    }
    let python = which::which("python3").with_context(|| {
        format!(
            "{what} not found, and python3 (with pip) is needed to install the pinned one into {}",
            dir.display()
        )
    })?;
    step(format!(
        "{what} not found: installing {} into {} (pip)",
        pins.packages.join(" "),
        dir.display()
    ));
    let scratch = project.scratch()?;
    let staged = scratch.path().join("toolchain");
    let packages = &pins.packages;
    cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check --no-warn-script-location --target {staged} {packages...}")
        .run()
        .with_context(|| format!("installing {what} with pip"))?;
    if let Some(root) = &pins.root {
        fix_cuda_layout(&staged.join(root))?;
        write_driver_stub(sh, &staged.join(root))?;
    }
    for rel in pins.tools.values() {
        let tool = staged.join(rel);
        if !tool.is_file() {
            bail!("the pinned install of {what} has no {rel}");
        }
        fsutil::set_executable(&tool)?;
    }
    std::fs::write(staged.join(".complete"), marker)?;
    fsutil::replace_dir(&staged, &dir)?;
    note(format!("installed {what} in {}", dir.display()));
    Ok(dir)
}

/// The pip wheels lay CUDA out as bin/, include/, lib/ with versioned libraries only. nvcc's
/// profile and CMake's FindCUDAToolkit expect lib64/ and unversioned names.
fn fix_cuda_layout(root: &Path) -> Result<()> {
    let lib = root.join("lib");
    if !root.join("lib64").exists() {
        std::os::unix::fs::symlink("lib", root.join("lib64")).context("linking lib64")?;
    }
    for entry in std::fs::read_dir(&lib).with_context(|| format!("listing {}", lib.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some((stem, _version)) = name.split_once(".so.") {
            let plain = lib.join(format!("{stem}.so"));
            if !plain.exists() {
                std::os::unix::fs::symlink(&name, &plain)
                    .with_context(|| format!("linking {}", plain.display()))?;
            }
        }
    }
    Ok(())
}

/// The pip wheels carry no libcuda.so (the driver provides it), but ggml-cuda calls the driver
/// API. Like a full toolkit's lib/stubs/libcuda.so, a link-only stub is built from cuda.h: every
/// driver function name, none of them usable. Its SONAME is libcuda.so.1 and no file of that name
/// is written, so at run time the loader can only find the real driver.
fn write_driver_stub(sh: &Shell, root: &Path) -> Result<()> {
    let header = root.join("include/cuda.h");
    let text = std::fs::read_to_string(&header)
        .with_context(|| format!("reading {}", header.display()))?;
    let names = driver_function_names(&text);
    if names.is_empty() {
        bail!("{} declares no driver functions", header.display());
    }
    let cc = which::which("cc").context(
        "a C compiler (cc) is needed to build the CUDA link stub: apt-get install -y gcc",
    )?;
    let stubs = root.join("lib/stubs");
    std::fs::create_dir_all(&stubs)?;
    let source = stubs.join("libcuda-stub.c");
    // 999 is CUDA_ERROR_UNKNOWN, should anything ever call the stub.
    let body: String = names
        .iter()
        .map(|n| format!("int {n}(void) {{ return 999; }}\n"))
        .collect();
    std::fs::write(&source, body)?;
    let library = stubs.join("libcuda.so");
    cmd!(
        sh,
        "{cc} -shared -fPIC -Wl,-soname,libcuda.so.1 -o {library} {source}"
    )
    .quiet()
    .run()
    .context("building the CUDA driver link stub")?;
    Ok(())
}

/// Names of the driver functions declared in cuda.h, and the versioned names its macros map
/// them to (cuMemAlloc -> cuMemAlloc_v2): both exist in the real libcuda.
fn driver_function_names(header: &str) -> Vec<String> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = std::collections::BTreeSet::new();
    for line in header.lines().map(str::trim) {
        if let Some(rest) = line.split_once("CUDAAPI ").map(|(_, r)| r.trim_start()) {
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            if name.starts_with("cu") && rest[name.len()..].trim_start().starts_with('(') {
                names.insert(name);
            }
        } else if let Some(rest) = line.strip_prefix("#define ") {
            let mut words = rest.split_whitespace();
            if let (Some(from), Some(to), None) = (words.next(), words.next(), words.next()) {
                let plain = |w: &str| w.starts_with("cu") && w.chars().all(is_ident);
                if plain(from) && plain(to) {
                    names.insert(from.to_owned());
                    names.insert(to.to_owned());
                }
            }
        }
    }
    names.into_iter().collect()
}

/// First line of `tool --version`, or why it could not be read.
pub fn version(sh: &Shell, tool: &Path) -> String {
    match cmd!(sh, "{tool} --version").quiet().ignore_stderr().read() {
        Ok(out) => {
            let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
            // nvcc's last line carries the release; others print it first.
            let pick = if lines.iter().any(|l| l.contains("Cuda compilation tools")) {
                lines.iter().find(|l| l.contains("release")).copied()
            } else {
                lines.first().copied()
            };
            pick.unwrap_or("?").trim().to_owned()
        }
        Err(err) => format!("cannot run: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_outdated_pinned_toolchain_is_reported_when_not_installing() {
        let dir = tempfile::tempdir().unwrap();
        let project = Project {
            root: dir.path().to_path_buf(),
        };
        let pins = PipToolchain {
            dir: "tools-1".into(),
            packages: vec!["cmake==1.0".into()],
            tools: [("cmake".to_owned(), "bin/cmake".to_owned())].into(),
            root: None,
        };
        let sh = Shell::new().unwrap();
        let look = |sh: &Shell| pip_toolchain(sh, &project, &pins, "cmake", Provision::LookOnly);
        let err = format!("{:#}", look(&sh).unwrap_err());
        assert!(
            err.contains("cmake not found") && err.contains("tools-1"),
            "{err}"
        );

        // An install made with other pins or an older layout does not count.
        let installed = project.toolchains_dir().join("tools-1");
        std::fs::create_dir_all(&installed).unwrap();
        std::fs::write(installed.join(".complete"), "cmake==0.9\n").unwrap();
        assert!(look(&sh).is_err());
        let marker = format!("layout {TOOLCHAIN_LAYOUT}\ncmake==1.0\n");
        std::fs::write(installed.join(".complete"), marker).unwrap();
        assert_eq!(look(&sh).unwrap(), installed);
    }

    #[test]
    fn toolkit_headers_are_system_includes_except_the_compilers_own() {
        let cuda = |root: &Path| Cuda {
            nvcc: Tool {
                path: root.join("bin/nvcc"),
                origin: "test",
            },
            root: root.to_path_buf(),
            driver: None,
        };
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(cuda(dir.path()).system_include(), None, "no include/");
        std::fs::create_dir_all(dir.path().join("include")).unwrap();
        assert_eq!(
            cuda(dir.path()).system_include(),
            Some(dir.path().join("include").canonicalize().unwrap())
        );
        // A distribution's toolkit in /usr: its headers are in the compiler's default folder.
        if Path::new("/usr/include").is_dir() {
            assert_eq!(cuda(Path::new("/usr")).system_include(), None);
        }
    }

    #[test]
    fn driver_names_come_from_declarations_and_version_macros() {
        let header = "\
CUresult CUDAAPI cuInit(unsigned int Flags);
CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
    #define cuMemAlloc                          cuMemAlloc_v2
#define CUDAAPI __stdcall
#define CU_LAUNCH_PARAM_END ((void*)0x00)
typedef CUresult (CUDAAPI *PFN_cuInit)(unsigned int);
";
        assert_eq!(
            driver_function_names(header),
            ["cuInit", "cuMemAlloc", "cuMemAlloc_v2"]
        );
    }
}
