fn main() -> std::process::ExitCode {
    kvrun::cli::main()
}
