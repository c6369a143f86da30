//! Hostile input: every case must end in an error, quickly, never a panic or a hang.

use std::time::{Duration, Instant};

use kubexm_bom::config::{LoadError, MAX_CONFIG_BYTES, load_file, load_str};

use crate::catalog;

fn refused_quickly(text: &str) -> String {
    let start = Instant::now();
    let err = load_str(text, "hostile.yaml", &catalog()).expect_err("hostile input was accepted");
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    err.to_string()
}

#[test]
fn deep_nesting_of_sequences() {
    let text = format!("spec: {}{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = refused_quickly(&text);
    assert!(err.contains("hostile.yaml:1:"), "{err}");
}

#[test]
fn deep_nesting_of_block_mappings() {
    let text: String = (0..5_000).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
    refused_quickly(&text);
}

#[test]
fn alias_bomb() {
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        text.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    refused_quickly(&text);
}

#[test]
fn binary_junk() {
    // Deterministic pseudo-random bytes, not valid UTF-8.
    let mut x: u32 = 0x9e37_79b9;
    let bytes: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.yaml");
    std::fs::write(&path, &bytes).unwrap();
    let err = load_file(&path, &catalog()).unwrap_err().to_string();
    assert!(err.contains("not UTF-8"), "{err}");
    // Junk that happens to be text is refused too.
    refused_quickly(&String::from_utf8_lossy(&bytes));
    refused_quickly("\u{0}\u{1}\u{2}: \u{7f}");
}

#[test]
fn fifty_megabyte_file_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(50 * 1024 * 1024).unwrap();
    let start = Instant::now();
    let err = load_file(&path, &catalog()).unwrap_err();
    assert!(matches!(err, LoadError::TooLarge { size, .. } if size > MAX_CONFIG_BYTES));
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "the file was read: {:?}",
        start.elapsed()
    );
    assert!(err.to_string().contains("at most 10485760 bytes"));
}

#[test]
fn empty_and_scalar_documents() {
    refused_quickly("");
    refused_quickly("42");
    refused_quickly("- a\n- b\n");
}
