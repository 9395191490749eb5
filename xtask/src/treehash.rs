//! The tree hash: one digest for a source tree, the same whether the tree came from a git
//! checkout or from an archive.
//!
//! Definition: list every regular file and symbolic link below the root, skipping anything named
//! `.git` (VCS metadata: a directory in a clone, a gitlink file in a submodule's archive); sort by
//! relative path ('/'-separated, bytewise); hash the lines `<sha256 of content>  <path>\n` (the
//! format of `sha256sum`) with sha256. A symbolic link's content is its target. Modes and empty
//! directories do not count.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeHash {
    /// `sha256:<hex>`
    pub digest: String,
    pub files: usize,
}

pub fn tree_hash(root: &Path) -> Result<TreeHash> {
    let mut files = Vec::new();
    collect(root, Path::new(""), &mut files)?;
    files.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut outer = Sha256::new();
    for (rel, abs) in &files {
        let file_digest = file_sha256(abs)?;
        outer.update(format!("{file_digest}  {rel}\n").as_bytes());
    }
    Ok(TreeHash {
        digest: format!("sha256:{}", hex(&outer.finalize())),
        files: files.len(),
    })
}

/// sha256 of one file's bytes (or of a symlink's target), as hex.
pub fn file_sha256(path: &Path) -> Result<String> {
    let meta =
        std::fs::symlink_metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let mut hasher = Sha256::new();
    if meta.file_type().is_symlink() {
        let target =
            std::fs::read_link(path).with_context(|| format!("reading link {}", path.display()))?;
        hasher.update(target.to_string_lossy().as_bytes());
    } else {
        let mut file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = file
                .read(&mut buf)
                .with_context(|| format!("reading {}", path.display()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
    }
    Ok(hex(&hasher.finalize()))
}

fn collect(root: &Path, rel: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<()> {
    let dir = root.join(rel);
    let entries = std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name();
        if name == ".git" {
            continue;
        }
        let rel_child = rel.join(&name);
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            collect(root, &rel_child, out)?;
        } else if file_type.is_file() || file_type.is_symlink() {
            let Some(rel_str) = rel_child.to_str() else {
                bail!("file name is not UTF-8: {}", rel_child.display());
            };
            out.push((rel_str.replace('\\', "/"), entry.path()));
        }
    }
    Ok(())
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, content: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    #[test]
    fn matches_sha256sum_format_and_ignores_vcs_metadata() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "b.txt", "bee\n");
        write(dir.path(), "a/x.c", "int x;\n");
        write(dir.path(), ".git/HEAD", "ref: refs/heads/main\n");
        write(dir.path(), "sub/.git", "gitdir: ../.git/modules/sub\n");
        let got = tree_hash(dir.path()).unwrap();
        assert_eq!(got.files, 2);

        // The same listing computed by hand.
        let line = |content: &str, path: &str| {
            format!("{}  {path}\n", hex(&Sha256::digest(content.as_bytes())))
        };
        let listing = line("int x;\n", "a/x.c") + &line("bee\n", "b.txt");
        let want = format!("sha256:{}", hex(&Sha256::digest(listing.as_bytes())));
        assert_eq!(got.digest, want);
    }

    #[test]
    fn changes_with_content_name_and_added_files() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "f", "1");
        let base = tree_hash(dir.path()).unwrap().digest;

        write(dir.path(), "f", "2");
        let edited = tree_hash(dir.path()).unwrap().digest;
        assert_ne!(base, edited);

        write(dir.path(), "f", "1");
        assert_eq!(tree_hash(dir.path()).unwrap().digest, base);

        write(dir.path(), "g", "");
        assert_ne!(tree_hash(dir.path()).unwrap().digest, base);
        std::fs::remove_file(dir.path().join("g")).unwrap();

        std::fs::rename(dir.path().join("f"), dir.path().join("h")).unwrap();
        assert_ne!(tree_hash(dir.path()).unwrap().digest, base);
    }
}
