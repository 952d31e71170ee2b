// Owning a Buf is owning its bytes: there is no second handle to the same range.
fn main() {
    let ctx = softverbs::Context::open(0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut mr = pd.alloc_mr(4096, softverbs::Access::LOCAL_WRITE).unwrap();
    let buf = mr.take(64).unwrap();
    let twin = buf.clone();
    drop((buf, twin));
}
