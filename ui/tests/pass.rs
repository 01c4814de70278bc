//! The pass cases of `#[idempotent]` and `#[idempotent_tools]` (`pass/`): each file is a program
//! that must compile (under edition 2021, this crate's) and whose `main` must run to the end.
//! They are modules of this one test binary, built with the rest of the workspace, rather than
//! trybuild cases: trybuild would build and link each as a program of its own, in its own target
//! directory, where it also builds every dependency for code generation rather than only checks
//! them as it does for the fail cases (`tests/ui.rs`).

macro_rules! pass {
    ($($case:ident = $path:literal),* $(,)?) => {
        $(
            #[path = $path]
            mod $case;

            #[test]
            fn $case() {
                $case::main();
            }
        )*

        /// The cases listed here.
        const CASES: &[&str] = &[$(stringify!($case)),*];
    };
}

/// Every file in `pass/` is a case here (trybuild's glob found a new one by itself; this list
/// does not).
#[test]
fn every_pass_file_is_listed() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/pass");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .expect("ui/pass")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .filter_map(|path| Some(path.file_stem()?.to_str()?.to_owned()))
        .collect();
    files.sort();
    let mut listed: Vec<&str> = CASES.to_vec();
    listed.sort_unstable();
    assert_eq!(
        files, listed,
        "ui/pass and the list in tests/pass.rs differ"
    );
}

pass! {
    business_key = "../pass/business_key.rs",
    crate_path = "../pass/crate_path.rs",
    free_fn = "../pass/free_fn.rs",
    hygiene = "../pass/hygiene.rs",
    key_options = "../pass/key_options.rs",
    method = "../pass/method.rs",
    mut_context = "../pass/mut_context.rs",
    rmcp_tool = "../pass/rmcp_tool.rs",
    task_tool = "../pass/task_tool.rs",
    trait_impl = "../pass/trait_impl.rs",
    transactional = "../pass/transactional.rs",
}
