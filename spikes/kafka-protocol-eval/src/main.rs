//! Issue 41, item 3: should the kafka-protocol crate replace the core's hand-written Kafka
//! requests and answers? `cargo run --release -- all` prints the tables of
//! bench/results/2026-12-06-kafka-protocol-eval/README.md: hostile answers, the fuzz targets'
//! inputs, and CPU per MiB.

mod alloc;
mod bench;
mod decoders;
mod fixture;
mod fuzz;
mod hostile;
#[path = "../../../fuzz/stable/runner.rs"]
mod runner;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

const DIR: &str = env!("CARGO_MANIFEST_DIR");

/// Runs `command` in a child: the fuzz runs end in an abort wherever the kernel refuses the
/// library's huge requests (that is the finding, and the report goes on), and the benchmark
/// after them would find the allocator holding what they freed.
fn in_a_fresh_process(command: &str) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = std::process::Command::new(exe)
        .arg(command)
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        println!("\n`{command}` ended: {status}\n");
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["hostile-case", name, decoder] => hostile::run_case(name, decoder),
        ["hostile"] => {
            hostile::report();
            Ok(())
        }
        ["fuzz"] => {
            fuzz::report(DIR);
            Ok(())
        }
        ["bench"] => bench::report(),
        [] | ["all"] => {
            hostile::report();
            in_a_fresh_process("fuzz").and_then(|()| in_a_fresh_process("bench"))
        }
        _ => Err("usage: kafka-protocol-eval [all | hostile | fuzz | bench]".into()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}
