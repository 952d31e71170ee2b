// While a buffer is registered (borrowed by its MR), plain code cannot read or write it:
// only the MR's atomic copies reach it.
fn main() {
    let ctx = softverbs::Context::open(0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut buf = vec![0u8; 4096];
    let mr = pd.reg_slice(&mut buf, softverbs::Access::LOCAL_WRITE).unwrap();
    buf[0] = 1;
    drop(mr);
}
