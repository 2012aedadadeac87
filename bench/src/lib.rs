//! Placeholder replaced below.
#[derive(clap::Args)]
pub struct BenchArgs {}
pub fn run(_: &BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
