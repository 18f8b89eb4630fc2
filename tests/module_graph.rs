//! The crate's top-level modules depend on each other without a cycle, so
//! each layer can be read (and changed) knowing only the layers below it.
//! Identifiers several layers share (stream ids, generations, backend
//! handles) live in `src/ids.rs`, below both `device` and `resource`.
//!
//! The check reads the sources: a module depends on another where its code
//! (comments left out) names `crate::<other>`, or `super::<other>` from a
//! file directly under `src/<module>/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`lib` for lib.rs).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_string()
}

/// Code without comments (line comments, doc comments, block comments).
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut in_block = false;
    for line in text.lines() {
        let mut rest = line;
        if in_block {
            match rest.find("*/") {
                Some(end) => {
                    rest = &rest[end + 2..];
                    in_block = false;
                }
                None => continue,
            }
        }
        if let Some(start) = rest.find("/*") {
            in_block = !rest[start..].contains("*/");
            rest = &rest[..start];
        }
        let code = rest.split("//").next().unwrap_or("");
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn names_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    code.match_indices(prefix)
        .map(|(i, _)| {
            let rest = &code[i + prefix.len()..];
            let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|n| !n.is_empty())
        .collect()
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let from = module_of(&src, file);
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let mut to: Vec<&str> = names_after(&code, "crate::");
        // `super::x` from src/<module>/file.rs names src/<module>/x, except
        // in mod.rs; from src/<module>/<sub>/... it stays inside <module>.
        if file.parent() == Some(src.as_path()) {
            to.extend(names_after(&code, "super::"));
        }
        for name in to {
            if name != from && modules.contains(name) {
                edges.entry(from.clone()).or_default().insert(name.to_string());
            }
        }
    }
    edges
}

/// A cycle through `start`, if there is one.
fn cycle_from(edges: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        edges: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in edges.get(at).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(edges, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(edges, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn top_level_modules_form_no_import_cycle() {
    let edges = graph();
    // The reader must see the known layering at all.
    assert!(edges["device"].contains("error") && edges["runtime"].contains("resources"), "{edges:?}");
    for module in edges.keys() {
        if let Some(cycle) = cycle_from(&edges, module) {
            panic!("import cycle: {}\nedges: {edges:#?}", cycle.join(" -> "));
        }
    }
    assert!(edges["resource"].contains("ids"), "{edges:?}");
    // The lowest layers depend on nothing above them.
    assert!(!edges.contains_key("ids"), "ids must depend on no other module: {:?}", edges.get("ids"));
    assert_eq!(edges.get("error").cloned().unwrap_or_default(), BTreeSet::from(["ids".to_string()]));
}
