// A borrowed MR cannot outlive the buffer it registers: the daemon would write freed memory.
fn main() {
    let ctx = softverbs::Context::open(0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr;
    {
        let mut buf = vec![0u8; 4096];
        mr = pd.reg_slice(&mut buf, softverbs::Access::LOCAL_WRITE).unwrap();
    }
    drop(mr);
}
