//! [`Transport`] for [`SmolToe`]: what the engine calls (listen, connect,
//! accept, send, receive, close, TCB views); the socket table and the
//! polling it drives are in `mod.rs`.

use super::*;

impl Transport for SmolToe {
    fn mac(&self) -> MacAddr {
        self.config.mac
    }

    fn wants(&self, frame: &[u8]) -> bool {
        frame::parse(frame).is_some_and(|segment| self.wants_segment(&segment))
    }

    fn ingress(&mut self, now: Instant, frame: &[u8], uplink: &mut dyn FnMut(&[u8])) {
        self.take_in(now, frame, uplink);
    }

    fn egress(&mut self, now: Instant, uplink: &mut dyn FnMut(&[u8])) {
        self.now = now;
        let sent = self.poll_due(now, uplink, self.burst().min(self.egress_room));
        self.egress_room = self.egress_room.saturating_sub(sent);
    }

    fn take_ready(&mut self, f: &mut dyn FnMut(SocketId)) {
        for id in self.ready.drain() {
            f(id);
        }
    }

    fn set_egress_room(&mut self, frames: usize) {
        self.egress_room = frames;
    }

    fn poll_at(&mut self, _now: Instant) -> Option<Instant> {
        self.timers.first().map(|&(at, _)| at)
    }

    fn listen(&mut self, port: u16, backlog: usize) -> Result<(), TcpError> {
        if port == 0 || backlog == 0 || backlog > MAX_BACKLOG {
            return Err(TcpError::Unaddressable);
        }
        if self.listeners.contains_key(&port) {
            return Err(TcpError::PortInUse(port));
        }
        if self.live + backlog > self.config.max_sockets {
            return Err(TcpError::NoResources);
        }
        self.listeners.insert(port, Listener { backlog, ..Listener::default() });
        self.rearm(port);
        Ok(())
    }

    fn unlisten(&mut self, port: u16) {
        let Some(listener) = self.listeners.remove(&port) else {
            return;
        };
        if let Some(index) = listener.armed {
            self.remove(index);
        }
        for index in listener.pending {
            let id = self.id_of(index);
            // Send the RST now; the socket is freed once it is out.
            if let Some(entry) = self.entry_mut(id) {
                entry.socket_mut().abort();
                entry.role = Role::Connection { listen_port: Some(port) };
                entry.released = true;
                entry.close_reason.get_or_insert(CloseReason::Aborted);
            }
            self.touch(index);
        }
    }

    fn accept(&mut self, port: u16) -> Option<SocketId> {
        let listener = self.listeners.get(&port)?;
        let (position, index) = listener.pending.iter().enumerate().find_map(|(position, &index)| {
            let entry = self.slots.get(index as usize)?.entry.as_ref()?;
            let state = map_state(entry.socket().state());
            matches!(state, TcpState::Established | TcpState::CloseWait).then_some((position, index))
        })?;
        if let Some(listener) = self.listeners.get_mut(&port) {
            listener.pending.remove(position);
        }
        let id = self.id_of(index);
        if let Some(entry) = self.entry_mut(id) {
            entry.role = Role::Connection { listen_port: Some(port) };
        }
        self.rearm(port);
        Some(id)
    }

    fn connect(
        &mut self,
        now: Instant,
        local_port: u16,
        remote: SocketAddrV4,
        next_hop: MacAddr,
    ) -> Result<SocketId, TcpError> {
        let ip = *remote.ip();
        if local_port == 0
            || remote.port() == 0
            || ip.is_unspecified()
            || ip.is_broadcast()
            || ip.is_multicast()
            || !frame::is_unicast(next_hop)
        {
            return Err(TcpError::Unaddressable);
        }
        let tuple = FourTuple { local: SocketAddrV4::new(self.config.ip, local_port), remote };
        // Our own TIME-WAIT for this tuple, which nobody holds any more,
        // gives way to the new connection (with a new random ISN), as
        // Linux's connect() reuses a TIME-WAIT port: the driver's stack
        // and rdma_cm let go of the port when the connection ended, and
        // pick it again long before our 2 MSL are over.
        if let Some(&index) = self.by_tuple.get(&tuple) {
            let lingering = self
                .slots
                .get(index as usize)
                .and_then(|slot| slot.entry.as_ref())
                .is_some_and(|e| e.released && e.socket().state() == tcp::State::TimeWait);
            if !lingering {
                return Err(TcpError::PortInUse(local_port));
            }
            self.remove(index);
        }
        if self.listeners.contains_key(&local_port) {
            return Err(TcpError::PortInUse(local_port));
        }
        let mut new = self.new_socket()?;
        new.socket
            .connect(
                self.iface.context(),
                IpEndpoint::new(IpAddress::Ipv4(ip), remote.port()),
                IpEndpoint::new(IpAddress::Ipv4(self.config.ip), local_port),
            )
            .map_err(|_| TcpError::Unaddressable)?;
        let index = self.insert(new, Role::Connection { listen_port: None }, next_hop).ok_or(TcpError::NoResources)?;
        let id = self.id_of(index);
        if let Some(entry) = self.entry_mut(id) {
            entry.tuple = Some(tuple);
            entry.state = TcpState::SynSent;
        }
        self.by_tuple.insert(tuple, index);
        self.now = now;
        self.touch(index);
        Ok(id)
    }

    fn status(&self, id: SocketId) -> Option<LinkStatus> {
        let entry = self.entry(id)?;
        if let Some(reason) = entry.close_reason {
            return Some(LinkStatus::Closed(reason));
        }
        let state = map_state(entry.socket().state());
        Some(match state {
            TcpState::Listen | TcpState::SynSent | TcpState::SynReceived => LinkStatus::Connecting,
            TcpState::Established => LinkStatus::Established,
            TcpState::CloseWait => LinkStatus::PeerClosed,
            TcpState::FinWait1 | TcpState::FinWait2 | TcpState::Closing | TcpState::LastAck => LinkStatus::Closing,
            TcpState::TimeWait => LinkStatus::Closed(CloseReason::Graceful),
            // Closed without a recorded reason: closed while we were not
            // looking (e.g. in `close` from SYN-SENT).
            TcpState::Closed => LinkStatus::Closed(CloseReason::Aborted),
        })
    }

    fn recv(&mut self, id: SocketId, f: &mut dyn FnMut(&[u8]) -> usize) -> Result<usize, TcpError> {
        let socket = self.socket_mut(id).ok_or(TcpError::NoSocket)?;
        let mut total = 0;
        // The ring hands out at most two contiguous pieces.
        for _ in 0..2 {
            if socket.recv_queue() == 0 {
                break;
            }
            let result = socket.recv(|data| {
                let consumed = f(data).min(data.len());
                (consumed, (consumed, data.len()))
            });
            match result {
                Ok((consumed, offered)) => {
                    total += consumed;
                    if consumed < offered || consumed == 0 {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        if total > 0 {
            // Reading opens the window: a window update may be due.
            self.touch(id.index);
        }
        Ok(total)
    }

    fn recv_queue(&self, id: SocketId) -> usize {
        self.socket(id).map_or(0, |socket| socket.recv_queue())
    }

    fn send_space(&self, id: SocketId) -> usize {
        match self.socket(id) {
            Some(socket) if socket.may_send() => socket.send_capacity() - socket.send_queue(),
            _ => 0,
        }
    }

    fn send_with(&mut self, id: SocketId, f: &mut dyn FnMut(&mut [u8]) -> usize) -> Result<usize, TcpError> {
        let socket = self.socket_mut(id).ok_or(TcpError::NoSocket)?;
        if !socket.may_send() {
            return Err(TcpError::InvalidState);
        }
        let written = socket
            .send(|buffer| {
                let written = f(buffer).min(buffer.len());
                (written, written)
            })
            .map_err(|_| TcpError::InvalidState)?;
        if written > 0 {
            self.touch(id.index);
        }
        Ok(written)
    }

    fn send_slice(&mut self, id: SocketId, data: &[u8]) -> Result<usize, TcpError> {
        let socket = self.socket_mut(id).ok_or(TcpError::NoSocket)?;
        if !socket.may_send() {
            return Err(TcpError::InvalidState);
        }
        let written = socket.send_slice(data).map_err(|_| TcpError::InvalidState)?;
        if written > 0 {
            self.touch(id.index);
        }
        Ok(written)
    }

    fn close(&mut self, id: SocketId) {
        let Some(socket) = self.socket_mut(id) else {
            return;
        };
        let was_open = socket.state() != tcp::State::Closed;
        socket.close();
        let closed_now = socket.state() == tcp::State::Closed;
        if let Some(entry) = self.entry_mut(id) {
            if was_open && closed_now {
                // Closing from SYN-SENT drops the socket without a word.
                entry.close_reason.get_or_insert(CloseReason::Aborted);
                entry.state = TcpState::Closed;
            }
        }
        self.touch(id.index);
    }

    fn abort(&mut self, id: SocketId) {
        let Some(socket) = self.socket_mut(id) else {
            return;
        };
        let was_open = socket.state() != tcp::State::Closed;
        socket.abort();
        if let Some(entry) = self.entry_mut(id) {
            if was_open {
                entry.close_reason.get_or_insert(CloseReason::Aborted);
            }
            entry.state = TcpState::Closed;
        }
        self.touch(id.index);
    }

    fn release(&mut self, id: SocketId) {
        let Some(entry) = self.entry_mut(id) else {
            return;
        };
        entry.released = true;
        self.touch(id.index);
    }

    fn mss(&self, id: SocketId) -> u16 {
        let ours = self.config.mss();
        match self.entry(id).and_then(|e| e.observed.peer_mss) {
            Some(peer) => ours.min(peer.max(64)),
            None => ours.min(536),
        }
    }

    fn tcb(&self, id: SocketId) -> Option<TcbInfo> {
        let entry = self.entry(id)?;
        let socket = entry.socket();
        let observed = &entry.observed;
        let (rcv_wscale, snd_wscale) = observed.window_scales();
        Some(TcbInfo {
            id,
            state: map_state(socket.state()),
            tuple: entry.tuple,
            listen_port: match entry.role {
                Role::Listening { port } | Role::Pending { port } => Some(port),
                Role::Connection { listen_port } => listen_port,
            },
            snd_una: observed.snd_una,
            snd_nxt: observed.snd_nxt,
            rcv_nxt: observed.rcv_nxt,
            snd_wnd: observed.peer_window.map(|w| u32::from(w) << snd_wscale),
            rcv_wnd: observed.our_window.map(|w| u32::from(w) << rcv_wscale),
            rcv_wscale,
            snd_wscale,
            local_mss: self.config.mss(),
            peer_mss: observed.peer_mss,
            srtt: observed.srtt,
            rttvar: observed.rttvar,
            retransmits: observed.retransmits,
            segs_in: observed.segs_in,
            segs_out: observed.segs_out,
            bytes_in: observed.bytes_in,
            bytes_out: observed.bytes_out,
            bytes_out_wire: observed.bytes_out_wire,
            send_queue: socket.send_queue(),
            recv_queue: socket.recv_queue(),
            close_reason: entry.close_reason,
            // The link's faults: filled in by the link (link.rs).
            blackholed: false,
            drop_percent: 0,
            delay: None,
            split: None,
        })
    }

    fn for_each_tcb(&self, f: &mut dyn FnMut(&TcbInfo)) {
        for index in 0..self.slots.len() {
            let Ok(index) = u32::try_from(index) else {
                break;
            };
            if let Some(tcb) = self.tcb(self.id_of(index)) {
                f(&tcb);
            }
        }
    }
}
