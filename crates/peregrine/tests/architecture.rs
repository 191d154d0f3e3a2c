//! ARCHITECTURE.md tells the truth about the crate graph: its dependency table lists, for
//! every workspace member, exactly the workspace crates that member depends on (normal
//! dependencies; dev- and build-dependencies are not part of the layering).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The line in ARCHITECTURE.md that introduces the checked table.
const MARKER: &str = "<!-- crate dependencies: checked by crates/peregrine/tests/architecture.rs -->";

type Graph = BTreeMap<String, BTreeSet<String>>;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn read_toml(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse().unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `peregrine-engine` -> `engine`; the binary package `peregrine` keeps its name.
fn short_name(package: &str) -> String {
    package.strip_prefix("peregrine-").unwrap_or(package).to_string()
}

/// Each workspace member and the workspace crates among its normal dependencies.
fn cargo_graph(root: &Path) -> Graph {
    let workspace = read_toml(&root.join("Cargo.toml"));
    let members = workspace["workspace"]["members"]
        .as_array()
        .expect("workspace.members");
    let mut packages = Vec::new();
    for member in members {
        let manifest = read_toml(&root.join(member.as_str().unwrap()).join("Cargo.toml"));
        let name = manifest["package"]["name"].as_str().unwrap().to_string();
        let deps: BTreeSet<String> = manifest
            .get("dependencies")
            .and_then(|d| d.as_table())
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default();
        packages.push((name, deps));
    }
    let names: BTreeSet<String> = packages.iter().map(|(n, _)| n.clone()).collect();
    packages
        .into_iter()
        .map(|(name, deps)| {
            let internal = deps
                .iter()
                .filter(|d| names.contains(*d))
                .map(|d| short_name(d))
                .collect();
            (short_name(&name), internal)
        })
        .collect()
}

/// The fenced block after [`MARKER`]: one `crate: dep, dep` line per crate (`-` for none).
fn documented_graph(text: &str) -> Graph {
    let after = text
        .split_once(MARKER)
        .expect("ARCHITECTURE.md lacks the dependency table marker")
        .1;
    let block = after
        .split("```")
        .nth(1)
        .expect("a fenced block after the marker");
    let mut graph = Graph::new();
    for line in block.lines().skip(1).map(str::trim).filter(|l| !l.is_empty()) {
        let (name, deps) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("`{line}`: expected `crate: deps`"));
        let deps = deps
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty() && *d != "-")
            .map(str::to_string)
            .collect();
        assert!(
            graph.insert(name.trim().to_string(), deps).is_none(),
            "{name} listed twice"
        );
    }
    graph
}

#[test]
fn architecture_lists_the_real_crate_dependencies() {
    let root = workspace_root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let documented = documented_graph(&text);
    let actual = cargo_graph(&root);
    assert!(
        actual.len() >= 8,
        "expected the workspace's crates, found {actual:?}"
    );
    for (name, deps) in &actual {
        let claimed = documented
            .get(name)
            .unwrap_or_else(|| panic!("ARCHITECTURE.md's table does not list crate `{name}`"));
        assert_eq!(
            claimed, deps,
            "ARCHITECTURE.md: dependencies of `{name}` (documented vs Cargo.toml)"
        );
    }
    for name in documented.keys() {
        assert!(
            actual.contains_key(name),
            "ARCHITECTURE.md lists `{name}`, which is no workspace member"
        );
    }
}

#[test]
fn the_table_parser_reads_what_it_is_given() {
    let text = format!("intro\n{MARKER}\n```text\na: -\nb: a\nc: a, b\n```\n");
    let graph = documented_graph(&text);
    assert_eq!(graph.len(), 3);
    assert!(graph["a"].is_empty());
    assert_eq!(graph["c"], BTreeSet::from(["a".to_string(), "b".to_string()]));
}
