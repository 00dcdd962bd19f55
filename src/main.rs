//! The `ppp` binary: everything lives in the library.

fn main() -> std::process::ExitCode {
    ppp::main()
}
