//! `device/src/abi.rs` must match `guest-driver/include/vt3_hw.h`: compile
//! the header with the system C compiler, print every size, offset and
//! constant, and compare with the Rust mirror — in both directions.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use vt3d::abi;

/// The clone being tested: cargo names it at run time too, and a test
/// binary reused from another clone's build (a shared target dir) must
/// not read that clone's files.
fn header_dir() -> PathBuf {
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    PathBuf::from(crate_dir).join("../guest-driver/include")
}

/// C field name for a Rust field name.
fn c_field(rust: &str) -> &str {
    rust.strip_prefix("r#").unwrap_or(rust)
}

/// Runs a C program that prints `NAME VALUE` lines.
fn c_values() -> BTreeMap<String, u64> {
    let mut prog = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"vt3_hw.h\"\nint main(void) {\n");
    for (name, _, fields) in abi::struct_layouts() {
        writeln!(prog, "printf(\"{name} %zu\\n\", sizeof(struct {name}));").unwrap();
        for (field, _) in fields {
            let f = c_field(field);
            writeln!(prog, "printf(\"{name}.{f} %zu\\n\", offsetof(struct {name}, {f}));").unwrap();
        }
    }
    for (name, _) in abi::enum_values().into_iter().chain(abi::constant_values()) {
        writeln!(prog, "printf(\"{name} %llu\\n\", (unsigned long long)({name}));").unwrap();
    }
    prog.push_str("return 0;\n}\n");

    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("layout.c");
    let exe = dir.path().join("layout");
    std::fs::write(&src, prog).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(header_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("a C compiler (cc) is needed for the ABI test");
    assert!(status.success(), "vt3_hw.h does not compile");
    let out = Command::new(&exe).output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn every_size_offset_and_constant_matches_the_header() {
    let c = c_values();
    let mut mismatches = Vec::new();
    let mut check = |key: String, rust: u64| match c.get(&key) {
        Some(&v) if v == rust => {}
        other => mismatches.push(format!("{key}: C {other:?}, Rust {rust}")),
    };
    for (name, size, fields) in abi::struct_layouts() {
        check(name.to_owned(), size as u64);
        for (field, offset) in fields {
            check(format!("{name}.{}", c_field(field)), offset as u64);
        }
    }
    for (name, value) in abi::enum_values().into_iter().chain(abi::constant_values()) {
        check(name.to_owned(), value);
    }
    assert!(mismatches.is_empty(), "ABI mismatches:\n{}", mismatches.join("\n"));
}

/// The header's string constants (`#define NAME "text"`), as C sees them.
#[test]
fn every_string_constant_matches_the_header() {
    let mut prog = String::from("#include <stdio.h>\n#include \"vt3_hw.h\"\nint main(void) {\n");
    for (name, _) in abi::string_values() {
        writeln!(prog, "printf(\"{name}=%s\\n\", {name});").unwrap();
    }
    prog.push_str("return 0;\n}\n");
    let dir = tempfile::tempdir().unwrap();
    let (src, exe) = (dir.path().join("strings.c"), dir.path().join("strings"));
    std::fs::write(&src, prog).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(header_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap();
    assert!(status.success(), "vt3_hw.h does not compile");
    let out = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
    let want: String = abi::string_values().iter().map(|(n, v)| format!("{n}={v}\n")).collect();
    assert_eq!(out, want);
}

/// Every struct, field and enum constant of the header has a mirror (the
/// union member `sge` of vt3_sq_wqe is mirrored by `inline_data`).
#[test]
fn nothing_in_the_header_is_left_unmirrored() {
    let text = std::fs::read_to_string(header_dir().join("vt3_hw.h")).unwrap();
    let rust_structs: BTreeMap<_, BTreeSet<_>> = abi::struct_layouts()
        .into_iter()
        .map(|(n, _, f)| (n, f.into_iter().map(|(f, _)| c_field(f).to_owned()).collect()))
        .collect();
    let rust_consts: BTreeSet<_> = abi::enum_values()
        .into_iter()
        .chain(abi::constant_values())
        .map(|(n, _)| n)
        .chain(abi::string_values().into_iter().map(|(n, _)| n))
        .collect();

    let mut current: Option<&str> = None;
    let mut missing = Vec::new();
    let mut in_enum = false;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("struct ").and_then(|r| r.strip_suffix(" {")) {
            current = Some(rest);
            if !rust_structs.contains_key(rest) {
                missing.push(format!("struct {rest}"));
            }
            continue;
        }
        if line.starts_with("enum ") && line.ends_with('{') {
            in_enum = true;
            continue;
        }
        if line.starts_with("};") {
            current = None;
            in_enum = false;
            continue;
        }
        if in_enum {
            if let Some(name) = line.split([' ', '=', ',']).next().filter(|n| n.starts_with("VT3_")) {
                if !rust_consts.contains(name) {
                    missing.push(name.to_owned());
                }
            }
            continue;
        }
        if let Some(name) = line.strip_prefix("#define ").and_then(|d| d.split_whitespace().next()) {
            let is_value = name.starts_with("VT3_") && !name.contains('(') && name != "VT3_HW_H";
            if is_value && !rust_consts.contains(name) {
                missing.push(name.to_owned());
            }
            continue;
        }
        let (Some(s), Some(decl)) = (current, line.split(';').next().filter(|_| line.contains(';'))) else {
            continue;
        };
        let Some(field) = decl.split_whitespace().last().map(|f| f.split('[').next().unwrap_or(f)) else {
            continue;
        };
        let known = rust_structs.get(s).is_some_and(|f| f.contains(field));
        let exempt = s == "vt3_sq_wqe" && field == "sge";
        if !(known || exempt) {
            missing.push(format!("{s}.{field}"));
        }
    }
    assert!(missing.is_empty(), "not mirrored in abi.rs: {missing:?}");
}
