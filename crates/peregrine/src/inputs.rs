//! Turning command-line arguments (files, directories, globs) into a list of image paths.

use std::path::{Path, PathBuf};

const IMAGE_EXTENSIONS: [&str; 5] = ["jpg", "jpeg", "png", "webp", "bmp"];

fn has_image_extension(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

/// Collects image files under `dir`, recursively, in sorted order.
fn walk(dir: &Path, out: &mut Vec<PathBuf>, problems: &mut Vec<String>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            problems.push(format!("{}: cannot read directory: {e}", dir.display()));
            return;
        }
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            walk(&p, out, problems);
        } else if has_image_extension(&p) {
            out.push(p);
        }
    }
}

/// Expands every argument. A file is taken as is (whatever its extension: the decoder will
/// say if it is not an image); a directory contributes its image files; anything else is
/// tried as a glob. Arguments that match nothing are reported, not fatal.
pub fn expand(args: &[String]) -> (Vec<PathBuf>, Vec<String>) {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for arg in args {
        let path = Path::new(arg);
        if path.is_file() {
            out.push(path.to_path_buf());
        } else if path.is_dir() {
            let before = out.len();
            walk(path, &mut out, &mut problems);
            if out.len() == before {
                problems.push(format!(
                    "{arg}: no images (jpg, jpeg, png, webp, bmp) in this directory"
                ));
            }
        } else if arg.contains(['*', '?', '[']) {
            match glob::glob(arg) {
                Ok(paths) => {
                    let mut matched: Vec<PathBuf> =
                        paths.filter_map(Result::ok).filter(|p| p.is_file()).collect();
                    matched.sort();
                    if matched.is_empty() {
                        problems.push(format!("{arg}: no files match this pattern"));
                    }
                    out.extend(matched);
                }
                Err(e) => problems.push(format!("{arg}: bad glob pattern: {e}")),
            }
        } else {
            problems.push(format!("{arg}: no such file or directory"));
        }
    }
    (out, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_files_dirs_and_globs() {
        let dir = std::env::temp_dir().join(format!("peregrine-inputs-{}", std::process::id()));
        let sub = dir.join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        for f in ["b.jpg", "a.PNG", "notes.txt", "sub/c.webp"] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        let d = dir.to_str().unwrap().to_string();
        let (paths, problems) = expand(std::slice::from_ref(&d));
        let names: Vec<_> = paths
            .iter()
            .map(|p| p.strip_prefix(&dir).unwrap().to_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["a.PNG", "b.jpg", "sub/c.webp"]);
        assert!(problems.is_empty());

        let (paths, _) = expand(&[format!("{d}/*.jpg"), format!("{d}/notes.txt")]);
        assert_eq!(paths, [dir.join("b.jpg"), dir.join("notes.txt")]);

        let (paths, problems) = expand(&[format!("{d}/missing.jpg"), format!("{d}/*.gif")]);
        assert!(paths.is_empty());
        assert_eq!(problems.len(), 2);
        assert!(problems[0].contains("no such file"));
        assert!(problems[1].contains("no files match"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
