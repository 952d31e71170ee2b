// An MR cannot outlive the PD it was registered in.
fn main() {
    let ctx = softverbs::Context::open(0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, softverbs::Access::LOCAL_WRITE).unwrap();
    drop(pd);
    drop(mr);
}
