//! The committed CRD is what the code generates: regenerate with
//! `cargo run -- crd > crds/mirrorflows.mirrorflow.io.yaml`.

#[test]
fn committed_crd_matches_the_rust_types() {
    let root = env!("CARGO_MANIFEST_DIR");
    let path = format!("{root}/{}", mirrorflow::api::crd::CRD_PATH);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = mirrorflow::api::crd::crd_yaml().expect("CRD renders");
    assert!(
        committed == generated,
        "{path} is stale: run `cargo run -- crd > {}`",
        mirrorflow::api::crd::CRD_PATH
    );
}
