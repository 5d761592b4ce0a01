# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""register_tensor against a real agent on a GPU machine (skips without torch, CUDA or FABRICXFER_SOCKET).

    agent standalone --socket-dir /tmp/fx &
    FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock python3 -m unittest -v tests.test_gpu
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True FABRICXFER_SOCKET=... python3 -m unittest -v tests.test_gpu
"""

import os
import unittest

from fabricxfer.client import Client, to_layout

SOCKET = os.environ.get("FABRICXFER_SOCKET", "")
EXPANDABLE = "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").lower()
try:
    import torch

    CUDA = torch.cuda.is_available()
except ImportError:
    torch, CUDA = None, False


@unittest.skipUnless(SOCKET and CUDA, "needs torch with a CUDA GPU and FABRICXFER_SOCKET")
class GPUTensorTest(unittest.TestCase):
    def setUp(self):
        self.c = Client(SOCKET)
        self.addCleanup(self.c.close)
        self.dev = torch.device("cuda", 0)

    def rand(self, *shape):
        return torch.randint(0, 256, shape, dtype=torch.uint8, device=self.dev)

    def move(self, src, dst, block, lids, rids):
        a = self.c.register_layout([self.c.register_tensor(t) for t in src], block)
        b = self.c.register_layout([self.c.register_tensor(t) for t in dst], block)
        torch.cuda.synchronize()
        self.c.transfer_blocks("write", a, torch.tensor(lids), to_layout(b), torch.tensor(rids))
        return a, b

    def test_views_of_one_tensor_register_and_move(self):
        """K and V as views of one allocation (one cudaMalloc segment, one IPC handle opened twice), and a row
        slice with a storage offset: only the view's own bytes are registered and written."""
        kv = self.rand(2, 64, 4096)  # 2 x 64 blocks of 4 KiB
        k, v = kv[0], kv[1]
        dst = torch.zeros(2, 64, 4096, dtype=torch.uint8, device=self.dev)
        self.move([k, v], [dst[0], dst[1]], 4096, [0, 5, 63], [1, 2, 3])
        for s, d in ((k, dst[0]), (v, dst[1])):
            self.assertTrue(torch.equal(d[[1, 2, 3]], s[[0, 5, 63]]))
            self.assertEqual(int(d[4:].count_nonzero()) + int(d[0].count_nonzero()), 0)
        # A slice in the middle of a bigger tensor: its neighbours must stay zero.
        big = torch.zeros(1000, 4096, dtype=torch.uint8, device=self.dev)
        middle = big[100:164]
        self.assertEqual(middle.storage_offset(), 100 * 4096)
        src = self.rand(64, 4096)
        self.move([src], [middle], 4096, list(range(64)), list(range(64)))
        self.assertTrue(torch.equal(big[100:164], src))
        self.assertEqual(int(big[:100].count_nonzero()) + int(big[164:].count_nonzero()), 0)

    def test_waited_calls_land_before_they_return(self):
        """Waited one-block calls through the mailbox: what the caller's next kernel reads must already be the new
        bytes."""
        src, dst = self.rand(256, 4096), torch.zeros(256, 4096, dtype=torch.uint8, device=self.dev)
        a = self.c.register_layout([self.c.register_tensor(src)], 4096)
        b = self.c.register_layout([self.c.register_tensor(dst)], 4096)
        torch.cuda.synchronize()
        g = torch.Generator().manual_seed(3)
        lids, rids = torch.randperm(256, generator=g), torch.randperm(256, generator=g)
        for i in range(256):
            self.c.transfer_blocks("write", a, lids[i:i + 1], to_layout(b), rids[i:i + 1])
            self.assertTrue(torch.equal(dst[int(rids[i])], src[int(lids[i])]), "call %d returned before its block landed" % i)

    def test_a_prepared_large_copy_lands_at_every_run_and_follows_new_registrations(self):
        """A 32 MiB block (the copy engine's range, replayed by the agent from its second copy) prepared once
        with torch ids and run again after the source changed; then the same two tensors registered again the
        other way round: a copy kept from before would move the old direction."""
        n = 32 << 20
        x, y = self.rand(n), torch.zeros(n, dtype=torch.uint8, device=self.dev)
        zero = torch.zeros(1, dtype=torch.int64)

        def layouts(src, dst):
            return (self.c.register_layout([self.c.register_tensor(src)], n),
                    self.c.register_layout([self.c.register_tensor(dst)], n))

        a, b = layouts(x, y)
        p = self.c.prepare_blocks("write", a, zero, to_layout(b), zero)
        for i in range(4):
            x.copy_(self.rand(n))
            torch.cuda.synchronize()
            self.assertIsNone(p.run())
            self.assertTrue(torch.equal(y, x), "run %d returned before its bytes landed" % i)
        for lay in (a, b):
            self.c.deregister_layout(lay)
            for r in lay.regions:
                self.c.deregister(r)
        y.copy_(self.rand(n))
        torch.cuda.synchronize()
        a, b = layouts(y, x)
        for i in range(3):
            self.c.transfer_blocks("write", a, zero, to_layout(b), zero)
            self.assertTrue(torch.equal(x, y), "copy %d after registering again moved the old direction" % i)
            y.copy_(self.rand(n))
            torch.cuda.synchronize()

    def test_block_refusals_move_nothing(self):
        """Ids out of range (either side, negative), repeated destination ids and layouts of another geometry
        are refused with INVALID_ARGUMENT naming the problem, and the GPU destination keeps every byte; the
        next good list lands (on the GPU, the ids are checked by the copy kernels themselves)."""
        import grpc

        src = [self.rand(256, 720), self.rand(256, 720)]
        dst = [self.rand(256, 720), self.rand(256, 720)]
        a = self.c.register_layout([self.c.register_tensor(t) for t in src], 720)
        b = self.c.register_layout([self.c.register_tensor(t) for t in dst], 720)
        odd = self.c.register_layout([self.c.register_tensor(self.rand(256, 736))], 736)
        torch.cuda.synchronize()
        before = [d.clone() for d in dst]
        for name, lids, rids, layout, says in (
            ("source id past the end", [1, 256], [2, 3], b, "outside"),
            ("negative destination id", [1, 2], [2, -1], b, "outside"),
            ("repeated destination id", [1, 2, 3], [7, 8, 7], b, "named twice"),
            ("other geometry", [1], [2], odd, "geometry"),
        ):
            with self.assertRaises(grpc.RpcError, msg=name) as e:
                self.c.transfer_blocks("write", a, torch.tensor(lids, dtype=torch.int32), to_layout(layout),
                                       torch.tensor(rids, dtype=torch.int32))
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, name)
            self.assertIn(says, e.exception.details(), name)
            torch.cuda.synchronize()
            for d, was in zip(dst, before):
                self.assertTrue(torch.equal(d, was), name + ": the destination changed")
        self.c.transfer_blocks("write", a, torch.tensor([0, 255], dtype=torch.int32), to_layout(b),
                               torch.tensor([9, 200], dtype=torch.int32))
        torch.cuda.synchronize()
        for s_, d in zip(src, dst):
            self.assertTrue(torch.equal(d[[9, 200]], s_[[0, 255]]))

    def test_long_lists_through_the_id_arena_are_checked_on_the_gpu(self):
        """Lists of 1,024 ids or more go through the fast connection's id arena and are checked by the copy
        kernels: an id out of range or a repeated destination refuses the whole list (INVALID_ARGUMENT, the GPU
        destination unchanged), a good list lands exactly, with int64 ids as torch gives them."""
        import grpc

        self.assertIsNotNone(self.c._arena, "the fast connection has no id arena")
        n, blocks = 2048, 4096
        src = [self.rand(blocks, 720), self.rand(blocks, 720)]
        dst = [self.rand(blocks, 720), self.rand(blocks, 720)]
        a = self.c.register_layout([self.c.register_tensor(t) for t in src], 720)
        b = self.c.register_layout([self.c.register_tensor(t) for t in dst], 720)
        torch.cuda.synchronize()
        g = torch.Generator().manual_seed(3)
        lids, rids = torch.randperm(blocks, generator=g)[:n], torch.randperm(blocks, generator=g)[:n]
        before = [d.clone() for d in dst]
        for name, bad_l, bad_r, says in (
            ("source id past the end", blocks, None, "outside"),
            ("destination id past the end", None, blocks + 5, "outside"),
            ("repeated destination id", None, "repeat", "twice"),
        ):
            l2, r2 = lids.clone(), rids.clone()
            if bad_l is not None:
                l2[n // 3] = bad_l
            if bad_r == "repeat":
                r2[n - 1] = r2[5]
            elif bad_r is not None:
                r2[n // 2] = bad_r
            with self.assertRaises(grpc.RpcError, msg=name) as e:
                self.c.transfer_blocks("write", a, l2, to_layout(b), r2)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, name)
            self.assertIn(says, e.exception.details(), name)
            torch.cuda.synchronize()
            for d, was in zip(dst, before):
                self.assertTrue(torch.equal(d, was), name + ": the destination changed")
        self.c.transfer_blocks("write", a, lids, to_layout(b), rids)
        torch.cuda.synchronize()
        for s_, d, was in zip(src, dst, before):
            want = was.clone()
            want[rids.to(d.device)] = s_[lids.to(d.device)]
            self.assertTrue(torch.equal(d, want))

    def test_expandable_segment_within_one_allocation_and_across_several(self):
        if not EXPANDABLE:
            self.skipTest("run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
        small = [self.rand(64, 4096), torch.zeros(64, 4096, dtype=torch.uint8, device=self.dev)]
        self.move([small[0]], [small[1]], 4096, [7, 8], [9, 10])
        self.assertTrue(torch.equal(small[1][[9, 10]], small[0][[7, 8]]))
        # 96 MiB K and V tensors span several 20 MiB allocations of the large pool: each registers as one region
        # (every allocation's fd, mapped back to back by the agent), and blocks crossing allocation boundaries
        # land byte for byte.
        block = 1 << 20
        src = [self.rand(96, block) for _ in range(2)]
        dst = [torch.zeros(96, block, dtype=torch.uint8, device=self.dev) for _ in range(2)]
        ids = list(range(96))
        self.move(src, dst, block, ids, ids[::-1])
        torch.cuda.synchronize()
        for s_, d in zip(src, dst):
            self.assertTrue(torch.equal(d, s_.flip(0)), "a block crossing an allocation boundary differs")

    def test_refusals(self):
        with self.assertRaises(ValueError):
            self.c.register_tensor(torch.zeros(16, dtype=torch.uint8))
        with self.assertRaises(ValueError):
            self.c.register_tensor(self.rand(64, 64).t())
        with self.assertRaises(ValueError):
            self.c.register_tensor(self.rand(64), gpu_index=1)

    @unittest.skipIf(EXPANDABLE, "an expandable segment is shared as VMM allocations, not as an IPC handle")
    def test_an_ipc_region_past_its_allocation_is_refused(self):
        """An IPC handle names the caching allocator's whole segment and the request says where the region lies
        in it: a request (built by hand, as any process may) that runs past the segment is refused with
        INVALID_ARGUMENT, since the agent's copies would reach whatever it maps beyond; the same request within
        the segment registers and moves."""
        import grpc

        from fabricxfer import client as fxclient
        from fabricxfer.agent.v1 import agent_pb2 as pb

        t = self.rand(1 << 20)
        share = t.untyped_storage()._share_cuda_()
        self.addCleanup(fxclient._release_ipc_counter, (share[4], share[5]))
        req, fds = self.c._tensor_request(share, 0, 0, t.numel(), "", t)
        self.assertEqual((req.handle_type, fds), (pb.HANDLE_TYPE_IPC, []))
        for name, offset, length in (("64 GiB of a small segment", req.offset, 64 << 30),
                                     ("an offset past the segment", req.offset + (1 << 40), 4096)):
            req.offset, req.length = offset, length
            with self.assertRaises(grpc.RpcError, msg=name) as e:
                self.c._call(self.c.stub.RegisterMemory, req)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, name)
            self.assertIn("runs past", e.exception.details(), name)
        dst = self.rand(1 << 20)
        a = self.c.register_layout([self.c.register_tensor(t)], 4096)
        b = self.c.register_layout([self.c.register_tensor(dst)], 4096)
        torch.cuda.synchronize()
        self.c.transfer_blocks("write", a, torch.tensor([3]), to_layout(b), torch.tensor([5]))
        self.assertTrue(torch.equal(dst[5 * 4096:6 * 4096], t[3 * 4096:4 * 4096]), "the next transfer after the refusals")

    def test_deregistered_tensor_memory_is_freed(self):
        """register_tensor shares the storage through PyTorch's IPC machinery, which holds the memory until the
        (never coming) receiver lets go; deregister lets go, so the memory is freed with the tensor."""
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(self.dev)
        t = self.rand(16 << 20 if not EXPANDABLE else 1 << 20)
        r = self.c.register_tensor(t)
        self.c.deregister(r)
        del t, r
        torch.cuda.synchronize()
        self.assertEqual(torch.cuda.memory_allocated(self.dev), before)


if __name__ == "__main__":
    unittest.main()
