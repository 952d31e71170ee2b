// Registering raw memory is an unsafe promise (RawMemory::new), not something safe code can do.
fn main() {
    let ctx = softverbs::Context::open(0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let raw = softverbs::RawMemory::new(0x1000, 4096);
    let _mr = pd.reg_mr(raw, softverbs::Access::LOCAL_WRITE).unwrap();
}
