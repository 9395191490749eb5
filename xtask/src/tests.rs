//! End-to-end tests of fetch, verify, patch and export against fake hosts: temporary git
//! repositories and archives, never the network.

use std::path::{Path, PathBuf};
use std::process::Command;

use xshell::Shell;

use crate::config::{HostConfig, Matrix, Toolchains};
use crate::project::Project;
use crate::treehash::{file_sha256, tree_hash};
use crate::{ci, host, patch};

fn git_in(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

struct Fixture {
    _tmp: tempfile::TempDir,
    tmp: PathBuf,
    project: Project,
    upstream: PathBuf,
    rev: String,
    hash: String,
}

const HOST: &str = "fake";

impl Fixture {
    /// A fake upstream git repository and a project whose host `fake` pins it.
    fn new() -> Fixture {
        let tmp_dir = tempfile::tempdir().unwrap();
        let tmp = tmp_dir.path().to_path_buf();
        let upstream = tmp.join("upstream");
        write(&upstream.join("CMakeLists.txt"), "project(fake C)\n");
        write(
            &upstream.join("src/engine.c"),
            "int engine(void) {\n    return 1;\n}\n\nint other(void) {\n    return 2;\n}\n",
        );
        write(&upstream.join("src/README"), "fake host\n");
        git_in(&upstream, &["init", "-q", "-b", "main"]);
        git_in(&upstream, &["add", "-A"]);
        git_in(&upstream, &["commit", "-q", "-m", "upstream"]);
        let rev = git_in(&upstream, &["rev-parse", "HEAD"]);
        let hash = tree_hash(&upstream).unwrap().digest;

        let root = tmp.join("project");
        write(&root.join("overlay/CMakeLists.txt"), "# overlay\n");
        write(&root.join("patches/fake/series"), "");
        let fixture = Fixture {
            _tmp: tmp_dir,
            tmp,
            project: Project { root },
            upstream,
            rev,
            hash,
        };
        fixture.write_host(
            &format!("file://{}", fixture.upstream.display()),
            &fixture.rev,
            &fixture.hash,
            "",
        );
        fixture
    }

    fn write_host(&self, upstream: &str, rev: &str, tree_hash: &str, extra: &str) {
        let text = format!(
            r#"
name = "fake"
upstream = "{upstream}"
rev = "{rev}"
tree_hash = "{tree_hash}"
mount = "src/flashrt"
{extra}
[cmake]
flashrt_option = "FLASHRT"
arch_option = "CMAKE_CUDA_ARCHITECTURES"
defaults = {{}}
cuda = {{}}
cpu = {{}}
[build]
targets = ["fake"]
overlay_target = "fake-overlay"
default_archs = ["90a"]
"#
        );
        write(&self.project.host_config_path(HOST), &text);
    }

    fn host(&self) -> HostConfig {
        self.project.host(HOST).unwrap()
    }

    fn tree(&self) -> PathBuf {
        self.project.tree_dir(HOST)
    }

    /// A .tar.gz like the PyPI sdist: the host tree below `fake-1.0/vendor/host`. Returns its sha256.
    fn make_archive(&self, name: &str) -> (PathBuf, String) {
        let staging = self.tmp.join("staging");
        let inner = staging.join("fake-1.0/vendor/host");
        crate::fsutil::copy_tree(&self.upstream, &inner, &|rel| {
            rel.file_name().is_some_and(|n| n == ".git")
        })
        .unwrap();
        // The sdist carries the submodule's gitlink file; it is not part of the tree.
        write(
            &inner.join(".git"),
            "gitdir: ../../.git/modules/vendor/host\n",
        );
        let archive = self.tmp.join(name);
        let status = Command::new("tar")
            .arg("-czf")
            .arg(&archive)
            .arg("-C")
            .arg(&staging)
            .arg("fake-1.0")
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::remove_dir_all(&staging).unwrap();
        let sha = file_sha256(&archive).unwrap();
        (archive, sha)
    }

    fn mirror_section(sha: &str) -> String {
        format!(
            "[mirror]\nkind = \"pypi-sdist\"\npackage = \"fake\"\nversion = \"1.0\"\nfile = \"fake-1.0.tar.gz\"\n\
             sha256 = \"{sha}\"\nsubdir = \"fake-1.0/vendor/host\"\n"
        )
    }

    /// Commits a change to src/engine.c in the working tree and exports it as the series.
    fn author_patch(&self, sh: &Shell) {
        patch::ensure_patched(sh, &self.project, &self.host(), None, false).unwrap();
        let tree = self.tree();
        let engine = tree.join("src/engine.c");
        let text = std::fs::read_to_string(&engine)
            .unwrap()
            .replace("return 1;", "return 42;");
        std::fs::write(&engine, text).unwrap();
        git_in(
            &tree,
            &[
                "commit",
                "-q",
                "-a",
                "-m",
                "engine: answer 42\n\nWhy: tests.",
            ],
        );
        patch::run(
            sh,
            &self.project,
            patch::PatchArgs {
                command: patch::PatchCommand::Export {
                    select: host::HostSelect { host: HOST.into() },
                    force: false,
                },
            },
        )
        .unwrap();
    }
}

fn err_text<T: std::fmt::Debug>(result: anyhow::Result<T>) -> String {
    format!("{:#}", result.unwrap_err())
}

#[test]
fn fetches_from_git_verifies_and_caches() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    let stamp = host::ensure_pristine(&sh, &f.project, &f.host(), None).unwrap();
    assert!(stamp.verified);
    assert_eq!(stamp.tree_hash, f.hash);
    assert!(stamp.source.starts_with("git "));
    let pristine = f.project.pristine_dir(HOST);
    assert_eq!(tree_hash(&pristine).unwrap().digest, f.hash);
    assert!(!pristine.join(".git").exists());

    // The cache answers without the upstream.
    std::fs::remove_dir_all(&f.upstream).unwrap();
    let again = host::ensure_pristine(&sh, &f.project, &f.host(), None).unwrap();
    assert_eq!(again, stamp);
}

#[test]
fn wrong_tree_hash_names_both_values_and_changes_nothing() {
    let f = Fixture::new();
    let wrong = format!("sha256:{}", "0".repeat(64));
    f.write_host(
        &format!("file://{}", f.upstream.display()),
        &f.rev,
        &wrong,
        "",
    );
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(&sh, &f.project, &f.host(), None));
    assert!(err.contains(&wrong) && err.contains(&f.hash), "{err}");
    assert!(!f.project.pristine_dir(HOST).exists());
}

#[test]
fn unknown_rev_is_reported() {
    let f = Fixture::new();
    let missing = "1234567890123456789012345678901234567890";
    f.write_host(
        &format!("file://{}", f.upstream.display()),
        missing,
        &f.hash,
        "",
    );
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(&sh, &f.project, &f.host(), None));
    assert!(err.contains(missing), "{err}");
    assert!(!f.project.pristine_dir(HOST).exists());
}

#[test]
fn host_src_with_local_edits_is_refused_with_the_files_listed() {
    let f = Fixture::new();
    std::fs::write(f.upstream.join("src/README"), "edited\n").unwrap();
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(
        &sh,
        &f.project,
        &f.host(),
        Some(&f.upstream),
    ));
    assert!(
        err.contains("tree hash mismatch") && err.contains("src/README"),
        "{err}"
    );
    assert!(!f.project.pristine_dir(HOST).exists());

    // Undone, the same checkout is accepted.
    git_in(&f.upstream, &["checkout", "--", "src/README"]);
    let stamp = host::ensure_pristine(&sh, &f.project, &f.host(), Some(&f.upstream)).unwrap();
    assert!(stamp.verified && stamp.source.starts_with("local directory"));
}

#[test]
fn mirror_archive_is_used_when_git_fails() {
    let f = Fixture::new();
    let (archive, sha) = f.make_archive("fake-1.0.tar.gz");
    let downloads = f.project.downloads();
    std::fs::create_dir_all(&downloads).unwrap();
    std::fs::copy(&archive, downloads.join("fake-1.0.tar.gz")).unwrap();
    let gone = format!("file://{}", f.tmp.join("no-such-repo").display());
    f.write_host(&gone, &f.rev, &f.hash, &Fixture::mirror_section(&sha));
    let sh = Shell::new().unwrap();
    let stamp = host::ensure_pristine(&sh, &f.project, &f.host(), None).unwrap();
    assert!(stamp.source.contains("fake==1.0"), "{}", stamp.source);
    assert_eq!(
        tree_hash(&f.project.pristine_dir(HOST)).unwrap().digest,
        f.hash
    );
}

#[test]
fn corrupt_mirror_archive_is_removed_and_reported() {
    let f = Fixture::new();
    let (archive, sha) = f.make_archive("fake-1.0.tar.gz");
    let downloads = f.project.downloads();
    std::fs::create_dir_all(&downloads).unwrap();
    let mut bytes = std::fs::read(&archive).unwrap();
    bytes[20] ^= 0xff;
    std::fs::write(downloads.join("fake-1.0.tar.gz"), &bytes).unwrap();
    let gone = format!("file://{}", f.tmp.join("no-such-repo").display());
    f.write_host(&gone, &f.rev, &f.hash, &Fixture::mirror_section(&sha));
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(&sh, &f.project, &f.host(), None));
    assert!(err.contains("corrupt") && err.contains(&sha), "{err}");
    assert!(!downloads.join("fake-1.0.tar.gz").exists());
    assert!(!f.project.pristine_dir(HOST).exists());
}

#[test]
fn truncated_archive_fails_extraction_cleanly() {
    let f = Fixture::new();
    let (archive, _) = f.make_archive("full.tar.gz");
    let bytes = std::fs::read(&archive).unwrap();
    // Pinned to the truncated bytes: the checksum passes and extraction must fail.
    let truncated = &bytes[..bytes.len() / 2];
    let downloads = f.project.downloads();
    std::fs::create_dir_all(&downloads).unwrap();
    std::fs::write(downloads.join("fake-1.0.tar.gz"), truncated).unwrap();
    let sha = file_sha256(&downloads.join("fake-1.0.tar.gz")).unwrap();
    let gone = format!("file://{}", f.tmp.join("no-such-repo").display());
    f.write_host(&gone, &f.rev, &f.hash, &Fixture::mirror_section(&sha));
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(&sh, &f.project, &f.host(), None));
    assert!(
        err.contains("truncated") || err.contains("tree hash mismatch"),
        "{err}"
    );
    assert!(!f.project.pristine_dir(HOST).exists());
}

#[test]
fn unpinned_host_without_source_explains_what_to_provide() {
    let f = Fixture::new();
    let text = "name = \"fake\"\nupstream = \"https://example.invalid/fake\"\nmount = \"m\"\n\
                note = \"Pass your checkout with --host-src DIR.\"\n\
                [cmake]\nflashrt_option = \"F\"\narch_option = \"A\"\ndefaults = {}\ncuda = {}\ncpu = {}\n\
                [build]\ntargets = []\noverlay_target = \"o\"\ndefault_archs = []\n";
    write(&f.project.host_config_path(HOST), text);
    let sh = Shell::new().unwrap();
    let err = err_text(host::ensure_pristine(&sh, &f.project, &f.host(), None));
    assert!(
        err.contains("no source for host fake") && err.contains("--host-src"),
        "{err}"
    );
    // build checks this before looking for any tool.
    let early = err_text(host::require_some_source(&f.project, &f.host(), None));
    assert_eq!(early, err);
    host::require_some_source(&f.project, &f.host(), Some(&f.upstream)).unwrap();
}

#[test]
fn export_then_check_reproduces_byte_for_byte() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    let series = patch::load_series(&f.project, HOST).unwrap();
    assert_eq!(series.patches, ["0001-engine-answer-42.patch"]);
    let text = std::fs::read_to_string(series.dir.join(&series.patches[0])).unwrap();
    assert!(
        text.starts_with("From 0000000000000000000000000000000000000000 "),
        "{text}"
    );
    assert!(
        text.contains("Why: tests.") && text.contains("+    return 42;"),
        "{text}"
    );

    patch::check(&sh, &f.project, &f.host(), None).unwrap();

    // A committed patch that applies but is not what the export produces is caught: here, a
    // hand-written diffstat (git am ignores it; the export has none).
    let edited = text.replacen("diff --git", "---\n src/engine.c | 2 +-\n\ndiff --git", 1);
    std::fs::write(series.dir.join(&series.patches[0]), edited).unwrap();
    let err = err_text(patch::check(&sh, &f.project, &f.host(), None));
    assert!(
        err.contains("0001-engine-answer-42.patch: differs"),
        "{err}"
    );
}

#[test]
fn apply_is_idempotent_and_mounts_the_overlay() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    let tree = patch::ensure_patched(&sh, &f.project, &f.host(), None, false).unwrap();
    let head = git_in(&tree, &["rev-parse", "HEAD"]);
    let engine_mtime = std::fs::metadata(tree.join("src/engine.c"))
        .unwrap()
        .modified()
        .unwrap();
    patch::ensure_patched(&sh, &f.project, &f.host(), None, false).unwrap();
    assert_eq!(git_in(&tree, &["rev-parse", "HEAD"]), head);
    assert_eq!(
        std::fs::metadata(tree.join("src/engine.c"))
            .unwrap()
            .modified()
            .unwrap(),
        engine_mtime
    );
    assert_eq!(
        std::fs::read_link(tree.join("src/flashrt")).unwrap(),
        f.project.overlay_dir()
    );
    assert!(std::fs::read_to_string(tree.join("src/engine.c"))
        .unwrap()
        .contains("return 42;"));
    assert_eq!(git_in(&tree, &["status", "--porcelain"]), "");
}

#[test]
fn unfit_patch_is_left_as_rejects_and_abort_returns_to_pristine() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    // Make the series no longer fit: its context line changes, so it fits neither the tree nor
    // its own preimage and no 3-way merge is possible.
    let series = patch::load_series(&f.project, HOST).unwrap();
    let path = series.dir.join(&series.patches[0]);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(" int engine(void) {", " int engine(int x) {");
    std::fs::write(&path, text).unwrap();

    let err = err_text(patch::ensure_patched(
        &sh,
        &f.project,
        &f.host(),
        None,
        false,
    ));
    assert!(
        err.contains("0001-engine-answer-42.patch")
            && err.contains("src/engine.c")
            && err.contains("rejected hunks in src/engine.c.rej")
            && err.contains("--continue")
            && err.contains("--abort"),
        "{err}"
    );
    let tree = f.tree();
    let pristine = git_in(&tree, &["rev-parse", "flashrt-pristine"]);
    assert_eq!(git_in(&tree, &["rev-parse", "HEAD"]), pristine);
    assert!(tree.join("src/engine.c.rej").is_file());
    let state = patch::patch_state(&sh, &f.project, &f.host()).unwrap();
    assert!(
        state.contains("apply failed at patch 0001-engine-answer-42.patch (1 of 1)")
            && state.contains("rejected hunks"),
        "{state}"
    );

    patch::abort_apply(&sh, &f.project, &f.host()).unwrap();
    assert_eq!(git_in(&tree, &["rev-parse", "HEAD"]), pristine);
    assert_eq!(git_in(&tree, &["status", "--porcelain"]), "");
    assert!(std::fs::read_to_string(tree.join("src/engine.c"))
        .unwrap()
        .contains("return 1;"));
    let state = patch::patch_state(&sh, &f.project, &f.host()).unwrap();
    assert!(state.starts_with("not applied"), "{state}");
    // Nothing left to abort or continue.
    assert!(err_text(patch::abort_apply(&sh, &f.project, &f.host())).contains("no stopped apply"));
    assert!(
        err_text(patch::continue_apply(&sh, &f.project, &f.host())).contains("no stopped apply")
    );
}

#[test]
fn local_edits_are_refused_unless_forced() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    let tree = f.tree();
    std::fs::write(tree.join("src/README"), "local edit\n").unwrap();
    std::fs::write(tree.join("scratch.txt"), "new file\n").unwrap();
    // The series changes, so the tree must be re-applied, which would lose the edits.
    std::fs::write(
        patch::load_series(&f.project, HOST)
            .unwrap()
            .dir
            .join("series"),
        "",
    )
    .unwrap();

    let err = err_text(patch::ensure_patched(
        &sh,
        &f.project,
        &f.host(),
        None,
        false,
    ));
    assert!(
        err.contains("src/README") && err.contains("scratch.txt") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(tree.join("src/README")).unwrap(),
        "local edit\n"
    );

    patch::ensure_patched(&sh, &f.project, &f.host(), None, true).unwrap();
    assert_eq!(
        std::fs::read_to_string(tree.join("src/README")).unwrap(),
        "fake host\n"
    );
    assert!(std::fs::read_to_string(tree.join("src/engine.c"))
        .unwrap()
        .contains("return 1;"));
}

#[test]
fn unexported_commits_are_refused_until_exported() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    let tree = f.tree();
    std::fs::write(tree.join("src/README"), "second change\n").unwrap();
    git_in(
        &tree,
        &["commit", "-q", "-a", "-m", "readme: second change"],
    );
    // Touch the series so that the tree counts as out of date.
    let series_file = f.project.patches_dir(HOST).join("series");
    let text = std::fs::read_to_string(&series_file).unwrap();
    std::fs::write(&series_file, format!("# ordered\n{text}")).unwrap();

    let err = err_text(patch::ensure_patched(
        &sh,
        &f.project,
        &f.host(),
        None,
        false,
    ));
    assert!(
        err.contains("commits that are not in the series") && err.contains("patch export"),
        "{err}"
    );

    patch::run(
        &sh,
        &f.project,
        patch::PatchArgs {
            command: patch::PatchCommand::Export {
                select: host::HostSelect { host: HOST.into() },
                force: false,
            },
        },
    )
    .unwrap();
    assert_eq!(
        patch::load_series(&f.project, HOST).unwrap().patches.len(),
        2
    );
    let head = git_in(&tree, &["rev-parse", "HEAD"]);
    patch::ensure_patched(&sh, &f.project, &f.host(), None, false).unwrap();
    assert_eq!(git_in(&tree, &["rev-parse", "HEAD"]), head);
    patch::check(&sh, &f.project, &f.host(), None).unwrap();
}

#[test]
fn interrupted_apply_resumes() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    let tree = f.tree();
    // As if killed mid-apply: the stamp says "applying", the tree is at the pristine commit.
    let stamp = f.project.host_work(HOST).join("src.json");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stamp).unwrap()).unwrap();
    value["series"] = serde_json::Value::Null;
    value["head"] = serde_json::Value::Null;
    std::fs::write(&stamp, value.to_string()).unwrap();
    git_in(&tree, &["reset", "-q", "--hard", "flashrt-pristine"]);

    patch::ensure_patched(&sh, &f.project, &f.host(), None, false).unwrap();
    assert!(std::fs::read_to_string(tree.join("src/engine.c"))
        .unwrap()
        .contains("return 42;"));
}

#[test]
fn the_repository_config_files_load() {
    let project = Project {
        root: Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf(),
    };
    let names = project.host_names().unwrap();
    assert!(
        names.contains(&"llama.cpp".to_owned()) && names.contains(&"jetson-pi-edge".to_owned())
    );
    for name in &names {
        project.host(name).unwrap();
    }
    let llama = project.host("llama.cpp").unwrap();
    assert_eq!(
        llama.rev.as_deref(),
        Some("0c1e57098bba43ac29e6e3b677cdceebdd22334f")
    );
    assert!(llama.tree_hash.is_some() && llama.mirror.is_some());
    let jetson = project.host("jetson-pi-edge").unwrap();
    assert!(jetson.rev.is_none() && jetson.tree_hash.is_none() && jetson.note.is_some());

    let series = patch::load_series(&project, "llama.cpp").unwrap();
    assert!(!series.patches.is_empty());
    assert!(patch::load_series(&project, "jetson-pi-edge").is_err());

    Toolchains::load(&project.root.join("toolchains.toml")).unwrap();
    let matrix = Matrix::load(&project.root.join("ci/matrix.toml")).unwrap();
    let cells = ci::expand(&matrix);
    for arch in ["90a", "100a", "110a", "120a"] {
        let name = format!("llama.cpp/compile-only/sm_{arch}/flashrt");
        assert!(cells.iter().any(|c| c.name == name), "missing cell {name}");
    }
}

#[test]
fn scratch_left_by_an_interrupted_run_is_removed() {
    let f = Fixture::new();
    let tmp = f.project.work().join("tmp");
    // pid_max is at most 2^22 on Linux: this process cannot exist.
    let abandoned = tmp.join("scratch-99999999-abc");
    let ours = tmp.join(format!("scratch-{}-live", std::process::id()));
    std::fs::create_dir_all(abandoned.join("tree")).unwrap();
    std::fs::create_dir_all(&ours).unwrap();
    let fresh = f.project.scratch().unwrap();
    assert!(!abandoned.exists());
    assert!(ours.exists() && fresh.path().exists());
}

#[test]
fn host_src_may_be_an_archive() {
    let f = Fixture::new();
    let archive = f.tmp.join("host.tar.gz");
    let status = Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(&f.tmp)
        .arg("upstream")
        .status()
        .unwrap();
    assert!(status.success());
    let sh = Shell::new().unwrap();
    let stamp = host::ensure_pristine(&sh, &f.project, &f.host(), Some(&archive)).unwrap();
    assert!(
        stamp.verified && stamp.source.starts_with("archive "),
        "{}",
        stamp.source
    );
    assert_eq!(
        tree_hash(&f.project.pristine_dir(HOST)).unwrap().digest,
        f.hash
    );

    // A truncated archive is reported and changes nothing.
    let bytes = std::fs::read(&archive).unwrap();
    let broken = f.tmp.join("broken.tar.gz");
    std::fs::write(&broken, &bytes[..bytes.len() / 2]).unwrap();
    let err = err_text(host::ensure_pristine(
        &sh,
        &f.project,
        &f.host(),
        Some(&broken),
    ));
    assert!(err.contains("corrupt or truncated"), "{err}");
    assert_eq!(
        tree_hash(&f.project.pristine_dir(HOST)).unwrap().digest,
        f.hash
    );
}

// --- A patch that does not apply: stop, resolve, continue, export -----------------------------

fn commit_all(tree: &Path, message: &str) {
    git_in(tree, &["commit", "-q", "-a", "-m", message]);
}

/// Replaces the first `from` in a file, which must hold it.
fn replace_in(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{} lacks {from:?}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

/// Every file of patches/fake, by name.
fn series_files(f: &Fixture) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(f.project.patches_dir(HOST))
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

fn export(f: &Fixture, sh: &Shell, force: bool) -> anyhow::Result<patch::Exported> {
    patch::export(sh, &f.project, &f.host(), force)
}

/// Authors and exports three patches: 0001 makes engine() answer 42, 0002 (on top of it) 43,
/// 0003 edits the README.
fn author_three_patches(f: &Fixture, sh: &Shell) -> Vec<String> {
    patch::ensure_patched(sh, &f.project, &f.host(), None, false).unwrap();
    let tree = f.tree();
    replace_in(&tree.join("src/engine.c"), "return 1;", "return 42;");
    commit_all(&tree, "engine: answer 42");
    replace_in(&tree.join("src/engine.c"), "return 42;", "return 43;");
    commit_all(&tree, "engine: answer 43");
    std::fs::write(tree.join("src/README"), "patched host\n").unwrap();
    commit_all(&tree, "readme: patched");
    let exported = export(f, sh, false).unwrap();
    assert!(exported.dropped.is_empty());
    assert_eq!(
        exported.patches,
        [
            "0001-engine-answer-42.patch",
            "0002-engine-answer-43.patch",
            "0003-readme-patched.patch"
        ]
    );
    exported.patches
}

/// Changes 0001 to answer 41, so that 0002 (made on top of 42) conflicts, and applies the series.
/// Returns the apply's error.
fn stop_at_second_patch(f: &Fixture, sh: &Shell) -> String {
    replace_in(
        &f.project
            .patches_dir(HOST)
            .join("0001-engine-answer-42.patch"),
        "+    return 42;",
        "+    return 41;",
    );
    err_text(patch::ensure_patched(
        sh,
        &f.project,
        &f.host(),
        None,
        false,
    ))
}

/// engine.c with 0002 resolved on top of the changed 0001.
const ENGINE_43: &str =
    "int engine(void) {\n    return 43;\n}\n\nint other(void) {\n    return 2;\n}\n";

#[test]
fn export_on_a_tree_without_the_series_refuses_and_force_says_what_it_drops() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    let names = author_three_patches(&f, &sh);
    // The issue's tree: back at the pristine commit, the series still in patches/.
    git_in(&f.tree(), &["reset", "-q", "--hard", "flashrt-pristine"]);
    let before = series_files(&f);

    let err = err_text(export(&f, &sh, false));
    assert!(
        err.contains("holds 0 commit(s) over the pristine pin, the series 3 patch(es)")
            && names.iter().all(|n| err.contains(n.as_str()))
            && err.contains("--force"),
        "{err}"
    );
    assert_eq!(series_files(&f), before);

    let exported = export(&f, &sh, true).unwrap();
    assert_eq!(exported.dropped, names);
    assert!(exported.patches.is_empty());
    assert_eq!(series_files(&f), [("series".to_owned(), Vec::new())]);
}

#[test]
fn export_refuses_a_series_changed_since_the_apply() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    // Someone else's change to the committed patch (e.g. pulled), not in the tree.
    let path = f
        .project
        .patches_dir(HOST)
        .join("0001-engine-answer-42.patch");
    replace_in(&path, "Why: tests.", "Why: tests, reworded upstream.");

    let err = err_text(export(&f, &sh, false));
    assert!(
        err.contains("patches/fake changed since the tree was applied")
            && err.contains("replace patches/fake")
            && err.contains("--force"),
        "{err}"
    );
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .contains("reworded upstream"));

    let exported = export(&f, &sh, true).unwrap();
    assert_eq!(exported.patches, ["0001-engine-answer-42.patch"]);
    assert!(exported.dropped.is_empty());
    assert!(!std::fs::read_to_string(&path)
        .unwrap()
        .contains("reworded upstream"));
}

#[test]
fn failed_apply_keeps_earlier_patches_leaves_a_conflict_and_records_it() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    author_three_patches(&f, &sh);
    let err = stop_at_second_patch(&f, &sh);
    assert!(
        err.contains("patch 0002-engine-answer-43.patch (2 of 3) does not apply")
            && err.contains("src/engine.c")
            && err.contains("Committed before it: 0001-engine-answer-42.patch")
            && err.contains("Not applied yet: 0003-readme-patched.patch")
            && err.contains("a 3-way conflict in src/engine.c")
            && err.contains("cargo xtask patch apply --host fake --continue")
            && err.contains("cargo xtask patch export --host fake")
            && err.contains("--abort"),
        "{err}"
    );
    let tree = f.tree();
    // 0001 is committed on the pristine commit with its own message.
    assert_eq!(
        git_in(&tree, &["rev-parse", "HEAD~1"]),
        git_in(&tree, &["rev-parse", "flashrt-pristine"])
    );
    assert_eq!(
        git_in(&tree, &["log", "-1", "--format=%s"]),
        "engine: answer 42"
    );
    // 0002 is a conflict between 0001's 41 and its own 43; 0003 is not applied.
    assert_eq!(
        git_in(&tree, &["diff", "--name-only", "--diff-filter=U"]),
        "src/engine.c"
    );
    let engine = std::fs::read_to_string(tree.join("src/engine.c")).unwrap();
    assert!(
        engine.contains("<<<<<<<")
            && engine.contains("return 41;")
            && engine.contains("return 43;"),
        "{engine}"
    );
    assert_eq!(
        std::fs::read_to_string(tree.join("src/README")).unwrap(),
        "fake host\n"
    );

    let state = patch::patch_state(&sh, &f.project, &f.host()).unwrap();
    assert!(
        state.starts_with(
            "apply failed at patch 0002-engine-answer-43.patch (2 of 3), left as a 3-way conflict in src/engine.c"
        ) && state.contains("--continue")
            && state.contains("patch export"),
        "{state}"
    );

    // Apply and build refuse to clobber it.
    let err = err_text(patch::ensure_patched(
        &sh,
        &f.project,
        &f.host(),
        None,
        false,
    ));
    assert!(
        err.contains("in the middle of an apply")
            && err.contains("--continue")
            && err.contains("--force"),
        "{err}"
    );
    assert!(std::fs::read_to_string(tree.join("src/engine.c"))
        .unwrap()
        .contains("<<<<<<<"));

    // Export refuses, with or without --force, naming what is missing and how to go on.
    let before = series_files(&f);
    for force in [false, true] {
        let err = err_text(export(&f, &sh, force));
        assert!(
            err.contains("0002-engine-answer-43.patch")
                && err.contains("0003-readme-patched.patch")
                && err.contains("--continue"),
            "{err}"
        );
    }
    assert_eq!(series_files(&f), before);

    // --force discards the stopped apply and applies afresh, which stops at the same patch.
    let err = err_text(patch::ensure_patched(
        &sh,
        &f.project,
        &f.host(),
        None,
        true,
    ));
    assert!(
        err.contains("patch 0002-engine-answer-43.patch (2 of 3) does not apply"),
        "{err}"
    );
    assert_eq!(
        git_in(&tree, &["log", "--format=%s", "flashrt-pristine..HEAD"]),
        "engine: answer 42"
    );
}

#[test]
fn export_refuses_uncommitted_edits_even_when_forced() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    f.author_patch(&sh);
    let tree = f.tree();
    std::fs::write(tree.join("src/README"), "not committed\n").unwrap();
    let before = series_files(&f);
    for force in [false, true] {
        let err = err_text(export(&f, &sh, force));
        assert!(
            err.contains("uncommitted changes") && err.contains("src/README"),
            "{err}"
        );
    }
    assert_eq!(series_files(&f), before);
    commit_all(&tree, "readme: committed");
    assert_eq!(export(&f, &sh, false).unwrap().patches.len(), 2);
}

#[test]
fn resolved_conflict_continues_and_exports_a_full_series_that_round_trips() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    let names = author_three_patches(&f, &sh);
    stop_at_second_patch(&f, &sh);
    let tree = f.tree();

    let err = err_text(patch::continue_apply(&sh, &f.project, &f.host()));
    assert!(
        err.contains("still has conflicts") && err.contains("src/engine.c"),
        "{err}"
    );
    std::fs::write(tree.join("src/engine.c"), ENGINE_43).unwrap();
    git_in(&tree, &["add", "src/engine.c"]);
    std::fs::write(tree.join("src/engine.c.orig"), "merge leftover\n").unwrap();
    let err = err_text(patch::continue_apply(&sh, &f.project, &f.host()));
    assert!(
        err.contains("not staged") && err.contains("src/engine.c.orig"),
        "{err}"
    );
    std::fs::remove_file(tree.join("src/engine.c.orig")).unwrap();

    patch::continue_apply(&sh, &f.project, &f.host()).unwrap();
    assert_eq!(
        git_in(&tree, &["log", "--format=%s", "flashrt-pristine..HEAD"]),
        "readme: patched\nengine: answer 43\nengine: answer 42"
    );
    assert_eq!(
        std::fs::read_to_string(tree.join("src/README")).unwrap(),
        "patched host\n"
    );
    let state = patch::patch_state(&sh, &f.project, &f.host()).unwrap();
    assert!(
        state.contains("0002-engine-answer-43.patch resolved by hand, not exported"),
        "{state}"
    );

    // Build refuses the resolved tree until it is exported, and leaves it alone.
    let head = git_in(&tree, &["rev-parse", "HEAD"]);
    let err = err_text(patch::ensure_patched(
        &sh,
        &f.project,
        &f.host(),
        None,
        false,
    ));
    assert!(
        err.contains("resolved by hand") && err.contains("patch export"),
        "{err}"
    );
    assert_eq!(git_in(&tree, &["rev-parse", "HEAD"]), head);

    let exported = export(&f, &sh, false).unwrap();
    assert_eq!(exported.patches, names);
    assert!(exported.dropped.is_empty());
    let dir = f.project.patches_dir(HOST);
    let first = std::fs::read_to_string(dir.join(&names[0])).unwrap();
    let second = std::fs::read_to_string(dir.join(&names[1])).unwrap();
    assert!(first.contains("+    return 41;"), "{first}");
    assert!(
        second.contains("Subject: [PATCH] engine: answer 43")
            && second.contains("-    return 41;")
            && second.contains("+    return 43;"),
        "{second}"
    );

    patch::check(&sh, &f.project, &f.host(), None).unwrap();
    patch::ensure_patched(&sh, &f.project, &f.host(), None, false).unwrap();
    assert_eq!(git_in(&tree, &["rev-parse", "HEAD"]), head);
    let state = patch::patch_state(&sh, &f.project, &f.host()).unwrap();
    assert_eq!(state, "3 patch(es) applied, up to date");
}

#[test]
fn resolution_committed_with_git_is_taken_by_continue() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    author_three_patches(&f, &sh);
    stop_at_second_patch(&f, &sh);
    let tree = f.tree();
    std::fs::write(tree.join("src/engine.c"), ENGINE_43).unwrap();
    git_in(&tree, &["add", "src/engine.c"]);
    // As a `git am` user would: the session commits it and ends.
    git_in(&tree, &["am", "--continue"]);

    // 0002 is committed, but the apply was not continued: 0003 is missing.
    let err = err_text(export(&f, &sh, false));
    assert!(
        err.contains("was not continued, so 0003-readme-patched.patch is not applied")
            && err.contains("Exporting now would drop:\n  0003-readme-patched.patch")
            && err.contains("cargo xtask patch apply --host fake --continue"),
        "{err}"
    );

    patch::continue_apply(&sh, &f.project, &f.host()).unwrap();
    let exported = export(&f, &sh, false).unwrap();
    assert_eq!(exported.patches.len(), 3);
    patch::check(&sh, &f.project, &f.host(), None).unwrap();

    // The same with a plain commit of the user's own, inside the session.
    let f = Fixture::new();
    author_three_patches(&f, &sh);
    stop_at_second_patch(&f, &sh);
    let tree = f.tree();
    std::fs::write(tree.join("src/engine.c"), ENGINE_43).unwrap();
    commit_all(&tree, "engine: answer 43 after 41");
    patch::continue_apply(&sh, &f.project, &f.host()).unwrap();
    assert!(!tree.join(".git/rebase-apply").exists());
    let exported = export(&f, &sh, false).unwrap();
    assert_eq!(
        exported.patches,
        [
            "0001-engine-answer-42.patch",
            "0002-engine-answer-43-after-41.patch",
            "0003-readme-patched.patch"
        ]
    );
    patch::check(&sh, &f.project, &f.host(), None).unwrap();
}

#[test]
fn patch_that_merges_cleanly_stops_for_review() {
    let f = Fixture::new();
    let sh = Shell::new().unwrap();
    patch::ensure_patched(&sh, &f.project, &f.host(), None, false).unwrap();
    let tree = f.tree();
    replace_in(
        &tree.join("src/engine.c"),
        "int other(void)",
        "int other2(void)",
    );
    commit_all(&tree, "engine: rename other");
    replace_in(&tree.join("src/engine.c"), "return 1;", "return 42;");
    commit_all(&tree, "engine: answer 42");
    export(&f, &sh, false).unwrap();
    // 0001 now renames to other3: 0002's context (other2) no longer fits, but merges.
    replace_in(
        &f.project
            .patches_dir(HOST)
            .join("0001-engine-rename-other.patch"),
        "+int other2(void) {",
        "+int other3(void) {",
    );

    let err = err_text(patch::ensure_patched(
        &sh,
        &f.project,
        &f.host(),
        None,
        false,
    ));
    assert!(
        err.contains("0002-engine-answer-42.patch (2 of 2)")
            && err.contains("a 3-way merge without conflicts")
            && err.contains("diff --cached"),
        "{err}"
    );
    assert_eq!(
        git_in(&tree, &["diff", "--cached", "--name-only"]),
        "src/engine.c"
    );
    let engine = std::fs::read_to_string(tree.join("src/engine.c")).unwrap();
    assert!(
        engine.contains("int other3(void)") && engine.contains("return 42;"),
        "{engine}"
    );

    patch::continue_apply(&sh, &f.project, &f.host()).unwrap();
    export(&f, &sh, false).unwrap();
    let second = std::fs::read_to_string(
        f.project
            .patches_dir(HOST)
            .join("0002-engine-answer-42.patch"),
    )
    .unwrap();
    assert!(second.contains(" int other3(void) {"), "{second}");
    patch::check(&sh, &f.project, &f.host(), None).unwrap();
}

/// This checkout, as a project (its README, overlay and config files).
fn repository() -> Project {
    Project {
        root: Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf(),
    }
}

#[test]
fn overlay_builds_refuse_architectures_the_overlay_lacks_before_any_work() {
    use crate::build::{self, BuildArgs};
    use clap::CommandFactory;

    let repo = repository();
    let supported = build::overlay_archs(&repo).unwrap();
    assert_eq!(supported, ["90a", "100a", "110a", "120a"]);
    // The compile-only cells and `build --help` name the same architectures.
    let matrix = repo.matrix().unwrap();
    for group in matrix
        .groups
        .iter()
        .filter(|g| g.kind == crate::config::CellKind::CompileOnly)
    {
        assert_eq!(group.archs, supported, "ci/matrix.toml compile-only archs");
    }
    let mut cli = crate::Cli::command();
    let help = cli
        .find_subcommand_mut("build")
        .unwrap()
        .get_arguments()
        .find(|a| a.get_id() == "arch")
        .and_then(|a| a.get_help())
        .unwrap()
        .to_string();
    for arch in &supported {
        assert!(
            help.contains(arch.as_str()),
            "build --help --arch lacks {arch}: {help}"
        );
    }
    assert!(help.contains("--stock"), "{help}");

    // A host with nothing to fetch from: whatever gets past the architecture check fails at once
    // with "no source", so a check that came too late could not start a build here.
    let tmp = tempfile::tempdir().unwrap();
    let project = Project {
        root: tmp.path().to_path_buf(),
    };
    std::fs::create_dir_all(project.overlay_dir()).unwrap();
    std::fs::copy(
        repo.overlay_dir().join("CMakeLists.txt"),
        project.overlay_dir().join("CMakeLists.txt"),
    )
    .unwrap();
    write(
        &project.host_config_path("nosrc"),
        "name = \"nosrc\"\nupstream = \"none\"\nmount = \"flashrt\"\n\
         [cmake]\nflashrt_option = \"F\"\narch_option = \"A\"\ndefaults = {}\ncuda = {}\ncpu = {}\n\
         [build]\ntargets = [\"t\"]\noverlay_target = \"o\"\ndefault_archs = [\"90a\"]\n",
    );
    let sh = Shell::new().unwrap();
    let attempt = |archs: &[&str], stock: bool| {
        err_text(build::build(
            &sh,
            &project,
            &BuildArgs {
                arch: archs.iter().map(|a| a.to_string()).collect(),
                stock,
                ..BuildArgs::new("nosrc")
            },
        ))
    };
    let err = attempt(&["90a", "sm_75", "86"], false);
    assert!(err.contains("not built for sm_75, sm_86"), "{err}");
    assert!(err.contains("sm_90a, sm_100a, sm_110a, sm_120a"), "{err}");
    assert!(err.contains("--stock --arch 75,86"), "{err}");
    // Plain and family forms mean the overlay's sm_XXa kernels; stock builds take any arch.
    for (archs, stock) in [(&["90", "120a", "100f"][..], false), (&["75"][..], true)] {
        let err = attempt(archs, stock);
        assert!(err.contains("no source for host nosrc"), "{archs:?}: {err}");
    }
    // A CPU build has no architectures to check.
    let err = err_text(build::build(
        &sh,
        &project,
        &BuildArgs {
            cpu: true,
            ..BuildArgs::new("nosrc")
        },
    ));
    assert!(err.contains("no source for host nosrc"), "{err}");
}

#[test]
fn host_src_that_is_not_a_host_tree_is_refused_before_hashing() {
    use std::os::unix::ffi::OsStrExt;

    let f = Fixture::new();
    f.write_host(
        &format!("file://{}", f.upstream.display()),
        &f.rev,
        &f.hash,
        "tree_markers = [\"CMakeLists.txt\", \"src/engine.c\", \"src/\"]\n",
    );
    let sh = Shell::new().unwrap();
    let stray = f.tmp.join("stray");
    write(&stray.join("notes.txt"), "not a host\n");
    write(&stray.join("src"), "a file where the host has a folder\n");
    // A name the tree hash refuses (not UTF-8): had hashing come first, it would fail on this.
    std::fs::write(stray.join(std::ffi::OsStr::from_bytes(b"\xff")), "").unwrap();
    let err = err_text(host::ensure_pristine(
        &sh,
        &f.project,
        &f.host(),
        Some(&stray),
    ));
    assert!(
        err.contains(
            "does not look like a fake tree: it has no CMakeLists.txt, src/engine.c, src/"
        ),
        "{err}"
    );
    assert!(
        err.contains("cargo xtask host fetch --host fake") && err.contains("host pack"),
        "{err}"
    );
    assert!(
        !err.contains("UTF-8") && !err.contains("pass that instead"),
        "{err}"
    );
    assert!(!f.project.pristine_dir(HOST).exists());

    // The folder above a checkout: the checkout inside is named.
    let err = err_text(host::ensure_pristine(
        &sh,
        &f.project,
        &f.host(),
        Some(&f.tmp),
    ));
    let hint = format!("{} does: pass that instead", f.upstream.display());
    assert!(err.contains(&hint), "{err}");

    // The checkout itself passes the check and is verified.
    let stamp = host::ensure_pristine(&sh, &f.project, &f.host(), Some(&f.upstream)).unwrap();
    assert!(stamp.verified);
}

/// `| `cargo xtask …` | … |` rows of README.md's "Commands" section: the first cell of each, without
/// its backticks and with `\|` unescaped.
fn readme_command_synopses(readme: &str) -> Vec<String> {
    let section = readme
        .split_once("\n## Commands\n")
        .map(|(_, rest)| rest.split("\n## ").next().unwrap_or_default())
        .expect("README.md has no \"## Commands\" section");
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `cargo xtask")) {
        let mut cell = String::new();
        let mut chars = line[1..].chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => cell.push(chars.next().unwrap()),
                '|' => break,
                _ => cell.push(c),
            }
        }
        rows.push(cell.trim().trim_matches('`').to_owned());
    }
    rows
}

/// Whether `token` (a flag such as `--host` or `-j`, or `<dump>`) stands alone in `text`: not
/// the start of a longer flag (`--host-src`).
fn mentions(text: &str, token: &str) -> bool {
    text.match_indices(token).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + token.len()..].chars().next();
        let joins = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-');
        !joins(before) && !joins(after)
    })
}

/// Every leaf command of `cmd` (one without subcommands), with its path after `cargo xtask`.
fn leaf_commands(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
    let subcommands: Vec<&clap::Command> = cmd
        .get_subcommands()
        .filter(|s| s.get_name() != "help")
        .collect();
    if subcommands.is_empty() {
        out.push((path.to_owned(), cmd.clone()));
    }
    for sub in subcommands {
        let sub_path = format!("{path} {}", sub.get_name());
        leaf_commands(sub, sub_path.trim(), out);
    }
}

/// The README's command table is checked against the CLI's own definition (as rust-analyzer
/// checks its generated docs): a row per command, every flag of the command in its row, and no
/// flag in a row that the command lacks.
#[test]
fn readme_command_table_matches_the_cli() {
    use clap::CommandFactory;

    let readme = std::fs::read_to_string(repository().root.join("README.md")).unwrap();
    let rows = readme_command_synopses(&readme);
    let mut leaves = Vec::new();
    leaf_commands(&crate::Cli::command(), "", &mut leaves);
    assert!(leaves.len() > 10, "{} commands", leaves.len());

    let mut problems = Vec::new();
    let row_of = |path: &str| -> Vec<&String> {
        let name = format!("cargo xtask {path}");
        rows.iter()
            .filter(|r| *r == &name || r.starts_with(&format!("{name} ")))
            .collect()
    };
    for (path, cmd) in &leaves {
        let args: Vec<&clap::Arg> = cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set() && !["help", "version"].contains(&a.get_id().as_str()))
            .collect();
        let tokens: Vec<String> = args
            .iter()
            .flat_map(|a| {
                let mut tokens = Vec::new();
                if let Some(long) = a.get_long() {
                    tokens.push(format!("--{long}"));
                }
                if let Some(short) = a.get_short() {
                    tokens.push(format!("-{short}"));
                }
                if a.is_positional() {
                    tokens.push(format!("<{}>", a.get_id()));
                }
                tokens
            })
            .collect();
        let found = row_of(path);
        let [row] = found.as_slice() else {
            let listing = if tokens.is_empty() {
                String::new()
            } else {
                format!(", listing {}", tokens.join(" "))
            };
            problems.push(match found.len() {
                0 => format!("no row for `cargo xtask {path}`: add one{listing}"),
                n => format!("{n} rows for `cargo xtask {path}`: keep one{listing}"),
            });
            continue;
        };
        for token in &tokens {
            if !mentions(row, token) {
                problems.push(format!("the row of `cargo xtask {path}` lacks {token}"));
            }
        }
        // Flags the row names that the command does not have.
        for (at, _) in row.match_indices("--") {
            let flag: String = row[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if !tokens.contains(&flag) {
                problems.push(format!(
                    "the row of `cargo xtask {path}` names {flag}, which the command does not have"
                ));
            }
        }
    }
    for row in &rows {
        let known = leaves.iter().any(|(path, _)| row_of(path).contains(&row));
        if !known {
            problems.push(format!("the row `{row}` is no command of the CLI"));
        }
    }
    assert!(
        problems.is_empty(),
        "README.md's Commands table is out of date with the CLI (xtask/src/main.rs and the \
         command modules); fix the table:\n  {}",
        problems.join("\n  ")
    );
}
