// A buffer posted for a receive belongs to the request until its completion hands it back.
fn main() {
    let ctx = softverbs::Context::open(0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4).unwrap();
    let qp = ctx
        .create_qp(&softverbs::QpInit::new(softverbs::QpType::Rc, &pd).cqs(&cq, &cq))
        .unwrap();
    let mut mr = pd.alloc_mr(4096, softverbs::Access::LOCAL_WRITE).unwrap();
    let mut buf = mr.take(64).unwrap();
    qp.post_recv_buf(buf).unwrap();
    buf.write(0, b"racing the daemon").unwrap();
}
