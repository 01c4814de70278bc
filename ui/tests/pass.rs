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
    };
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
