from sidecar.buffer_budget import BufferBudget


def test_reserve_release_and_waiters_in_order_with_small_ones_passing() -> None:
    b = BufferBudget(100)
    assert b.reserve(60)
    assert not b.reserve(50)
    got: list[str] = []
    big = b.wait(90, lambda: got.append("big"))
    b.wait(50, lambda: got.append("mid"))
    assert b.reserve(30)  # fits now: granted at once although others wait
    assert got == []
    b.release(60)  # 30 used: mid (50) fits, big (90) does not
    assert got == ["mid"] and b.used == 80
    b.cancel(big)
    b.release(80)
    assert got == ["mid"] and b.used == 0


def test_resize_serves_waiters() -> None:
    b = BufferBudget(10)
    got: list[int] = []
    b.wait(20, lambda: got.append(20))
    b.resize(20)
    assert got == [20] and b.used == 20
