/**
 * The panel's end of the comm: which kernel it follows, which comm is live,
 * what the latest state is.
 *
 * No DOM and no Jupyter runtime import (types only), so jest drives it with
 * fake kernels.  Lifecycle:
 *
 * - {@link PanelLink.follow} a kernel: register the comm target on it (the
 *   kernel opens a comm to us when `%load_ext gpucell` runs later) and open a
 *   comm to it with a `hello` (answered with a state when gpucell is loaded;
 *   closed by the kernel at once when it is not: the hint is shown);
 * - any comm, from either side, that delivers a valid `state` becomes the live
 *   one (requests go through it); an older live comm is closed;
 * - the kernel restarting or dying drops every comm and the state at once; when
 *   it is back (idle or busy) the target is registered and a hello sent again;
 * - invalid messages are ignored with a console warning, nothing throws.
 */

import type { Kernel, KernelMessage } from '@jupyterlab/services';
import type { JSONObject } from '@lumino/coreutils';

import {
  PanelRequest,
  ReplyMessage,
  StateMessage,
  TARGET,
  hello,
  validate
} from './api';
import { Phase, Snapshot, selectionMessage } from './view';

/** Kernel statuses after which the kernel's comms and gpucell are gone. */
const LOST: ReadonlySet<string> = new Set([
  'restarting',
  'autorestarting',
  'dead',
  'terminating'
]);
/** Statuses of a kernel that is up and takes messages. */
const UP: ReadonlySet<string> = new Set(['idle', 'busy']);

type IComm = Kernel.IComm;
type IKernel = Kernel.IKernelConnection;

function quietly(f: () => unknown): void {
  try {
    const r = f() as { done?: Promise<unknown> } | undefined;
    // a future cancelled by a restart must not become an unhandled rejection
    void r?.done?.catch?.(() => undefined);
  } catch {
    // a comm of a disposed or restarted kernel: nothing left to tell it
  }
}

export class PanelLink {
  /**
   * @param changed - called (synchronously) after every change of the snapshot
   */
  constructor(changed: (s: Snapshot) => void) {
    this._changed = changed;
  }

  /** Everything the views need now. */
  get snapshot(): Snapshot {
    return {
      phase: this._phase,
      state: this._state,
      reply: this._reply,
      pending: this._pending
    };
  }

  /** The kernel followed now (null: none). */
  get kernel(): IKernel | null {
    return this._kernel;
  }

  /** Whether requests can be sent (a comm delivered a state). */
  get connected(): boolean {
    return this._live !== null;
  }

  /**
   * Follow the active notebook's kernel (`kernel` null: the notebook has
   * none; `notebook` false: no notebook is active).  Following the same
   * kernel again changes nothing.
   */
  follow(kernel: IKernel | null, notebook = true): void {
    const phase: Phase = !notebook
      ? 'no-notebook'
      : kernel === null
        ? 'no-kernel'
        : 'connecting';
    if (kernel === this._kernel && (kernel !== null || phase === this._phase)) {
      return;
    }
    this._drop(true);
    this._kernel = kernel;
    this._stale = false;
    if (kernel === null) {
      this._set(phase);
    } else if (LOST.has(kernel.status)) {
      this._lost();
    } else {
      this._attach();
    }
  }

  /** The followed kernel's status changed (restarts, death, back up). */
  status(status: Kernel.Status | string): void {
    if (this._kernel === null) {
      return;
    }
    if (LOST.has(status)) {
      if (!this._stale) {
        this._lost();
      }
    } else if (this._stale && UP.has(status)) {
      this._attach();
    }
  }

  /**
   * Say hello again when gpucell did not answer (the panel is being opened):
   * recovers a comm the kernel opened that another client of the same kernel
   * (a console without this extension's target, say) closed for everyone.
   */
  retry(): void {
    if (this._kernel !== null && !this._stale && this._phase === 'not-loaded') {
      this._attach();
    }
  }

  /** Send a request over the live comm; false when there is none. */
  send(msg: PanelRequest): boolean {
    const comm = this._live;
    if (comm === null || comm.isDisposed) {
      return false;
    }
    try {
      const future = comm.send(msg as unknown as JSONObject);
      void future?.done?.catch?.(() => undefined);
      return true;
    } catch (e) {
      console.warn('gpucell: could not send', msg, e);
      return false;
    }
  }

  /**
   * Ask for these ticks (engines null when all are ticked); they are shown
   * until the kernel replies to the request.
   */
  select(ticks: ReadonlyArray<{ engine: number; checked: boolean }>): boolean {
    if (!this.send(selectionMessage(ticks))) {
      return false;
    }
    this._pending = new Map(ticks.map(t => [t.engine, t.checked]));
    this._emit();
    return true;
  }

  /** Stop following: close our comms. */
  dispose(): void {
    this._drop(true);
    this._kernel = null;
    this._phase = 'no-notebook';
  }

  // ---------------------------------------------------------------- private

  private _attach(): void {
    const kernel = this._kernel;
    if (kernel === null) {
      return;
    }
    this._stale = false;
    this._set('connecting');
    try {
      // the kernel opens a comm to us when gpucell is loaded after this
      kernel.registerCommTarget(TARGET, (comm, msg) =>
        this._opened(kernel, comm, msg)
      );
      const comm = kernel.createComm(TARGET);
      this._adopt(comm);
      const future = comm.open(hello() as unknown as JSONObject);
      void future?.done?.catch?.(() => undefined);
    } catch (e) {
      console.warn('gpucell: cannot open a comm to the kernel', e);
      this._drop(false);
      this._set('not-loaded');
    }
  }

  /** The kernel opened a comm to us; its open message carries a state. */
  private _opened(
    kernel: IKernel,
    comm: IComm,
    msg: KernelMessage.ICommOpenMsg
  ): void {
    if (kernel !== this._kernel) {
      // a kernel we no longer follow: it learns so, and forgets the comm
      quietly(() => comm.close());
      return;
    }
    // (a kernel that opens a comm is up, even if its 'idle' is still to come)
    this._stale = false;
    this._adopt(comm);
    const data = msg.content.data;
    if (data && Object.keys(data).length > 0) {
      this._receive(comm, data);
    }
  }

  private _adopt(comm: IComm): void {
    this._comms.add(comm);
    comm.onMsg = msg => this._receive(comm, msg.content.data);
    comm.onClose = () => this._closed(comm);
  }

  private _receive(comm: IComm, data: unknown): void {
    if (!this._comms.has(comm)) {
      return;
    }
    const problems = validate(data);
    if (problems.length) {
      console.warn(
        'gpucell: ignoring an invalid panel message:',
        problems,
        data
      );
      return;
    }
    const msg = data as StateMessage | ReplyMessage | { type: string };
    if (msg.type === 'state') {
      const state = msg as StateMessage;
      if (this._live !== comm) {
        const old = this._live;
        this._live = comm;
        if (old !== null) {
          this._forget(old);
          quietly(() => old.close());
        }
      }
      this._state = state;
      this._confirm(state);
      this._set('loaded');
    } else if (msg.type === 'reply') {
      const reply = msg as ReplyMessage;
      this._reply = reply;
      if (reply.request === 'select') {
        this._pending = null;
      }
      this._emit();
    } else {
      console.warn('gpucell: ignoring a panel-to-kernel message', data);
    }
  }

  /** Drop the unconfirmed ticks once the state shows them all. */
  private _confirm(state: StateMessage): void {
    const pending = this._pending;
    if (pending === null) {
      return;
    }
    const devices = state.cluster?.devices ?? [];
    if (
      devices.every(d => (pending.get(d.engine) ?? d.selected) === d.selected)
    ) {
      this._pending = null;
    }
  }

  /** The kernel closed a comm (gpucell not loaded, or unloaded). */
  private _closed(comm: IComm): void {
    if (!this._comms.delete(comm)) {
      return;
    }
    if (comm === this._live) {
      this._live = null;
      this._state = null;
      this._reply = null;
      this._pending = null;
      this._set(this._comms.size ? 'connecting' : 'not-loaded');
    } else if (this._live === null && this._comms.size === 0) {
      this._set('not-loaded');
    }
  }

  /** The kernel restarts or died: its comms and gpucell are gone. */
  private _lost(): void {
    this._drop(false);
    this._stale = true;
    this._set('restarting');
  }

  /** Forget every comm (and close them when `close`) and the state. */
  private _drop(close: boolean): void {
    const comms = [...this._comms];
    this._comms.clear();
    this._live = null;
    this._state = null;
    this._reply = null;
    this._pending = null;
    for (const comm of comms) {
      this._forget(comm);
      if (close) {
        quietly(() => comm.close());
      }
    }
  }

  private _forget(comm: IComm): void {
    this._comms.delete(comm);
    comm.onMsg = () => undefined;
    comm.onClose = () => undefined;
  }

  private _set(phase: Phase): void {
    this._phase = phase;
    this._emit();
  }

  private _emit(): void {
    try {
      this._changed(this.snapshot);
    } catch (e) {
      console.warn('gpucell: the panel failed to update', e);
    }
  }

  private _changed: (s: Snapshot) => void;
  private _kernel: IKernel | null = null;
  private _phase: Phase = 'no-notebook';
  private _state: StateMessage | null = null;
  private _reply: ReplyMessage | null = null;
  private _pending: ReadonlyMap<number, boolean> | null = null;
  private _comms = new Set<IComm>();
  private _live: IComm | null = null;
  /** the kernel restarted or died: attach again once it is up */
  private _stale = false;
}
