/**
 * gpucell's JupyterLab extension: a status-bar item and a "GPU cluster" side
 * panel for the active notebook's kernel, fed by one comm (`api.ts`), opened
 * from the status bar, the side bar, the command palette or the View menu.
 * It needs only tokens Notebook 7 also provides (the status bar, palette and
 * menu are optional), so the same build runs there.
 */

import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  MainAreaWidget,
  showDialog,
  type ISessionContext
} from '@jupyterlab/apputils';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import type { Kernel } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { cancel, start, stop } from './api';
import { OPEN_COMMAND, registerOpenCommand } from './commands';
import { PanelLink } from './link';
import { GpucellPanel, PANEL_ID, StatusItem, TimelineView } from './panel';
import { Snapshot, viewModel } from './view';

const gpuIcon = new LabIcon({
  name: 'gpucell:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<path d="M7 7h10v10H7zm2 2v6h6V9z"/>' +
    '<path d="M9 2h2v3H9zm4 0h2v3h-2zM9 19h2v3H9zm4 0h2v3h-2zM2 9h3v2H2zm0 4h3v2H2zm17-4h3v2h-3zm0 4h3v2h-3z"/>' +
    '</g></svg>'
});

/** Follow the active notebook, its kernel changes and its kernel's status. */
class Follower {
  constructor(tracker: INotebookTracker, link: PanelLink) {
    this._link = link;
    tracker.currentChanged.connect((_, panel) => this._follow(panel), this);
    this._follow(tracker.currentWidget);
  }

  private _follow(panel: NotebookPanel | null): void {
    const old = this._context;
    if (old) {
      old.kernelChanged.disconnect(this._kernelChanged, this);
      old.statusChanged.disconnect(this._statusChanged, this);
    }
    const ctx = panel?.sessionContext ?? null;
    this._context = ctx;
    if (ctx) {
      ctx.kernelChanged.connect(this._kernelChanged, this);
      ctx.statusChanged.connect(this._statusChanged, this);
    }
    this._link.follow(ctx?.session?.kernel ?? null, panel !== null);
  }

  private _kernelChanged(ctx: ISessionContext): void {
    if (ctx === this._context) {
      this._link.follow(ctx.session?.kernel ?? null, true);
    }
  }

  private _statusChanged(ctx: ISessionContext, status: Kernel.Status): void {
    if (ctx !== this._context) {
      return;
    }
    // a kernel the session got without a kernelChanged we saw
    const kernel = ctx.session?.kernel ?? null;
    if (kernel !== this._link.kernel) {
      this._link.follow(kernel, true);
    }
    this._link.status(status);
  }

  private _link: PanelLink;
  private _context: ISessionContext | null = null;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpucell:plugin',
  description:
    "gpucell's status-bar item and GPU cluster panel for the active notebook's kernel",
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ICommandPalette, IMainMenu],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    mainMenu: IMainMenu | null
  ) => {
    let link: PanelLink | null = null;
    let timeline: MainAreaWidget<TimelineView> | null = null;
    const openTimeline = (src: string, title: string) => {
      let tab = timeline;
      if (!tab || tab.isDisposed) {
        const content = new TimelineView();
        tab = timeline = new MainAreaWidget({ content });
        tab.id = `${content.id}-tab`;
        tab.title.icon = gpuIcon;
        tab.title.closable = true;
      }
      tab.content.showTimeline(src, title);
      tab.title.label = tab.content.title.label;
      if (!tab.isAttached) {
        app.shell.add(tab, 'main');
      }
      if (tab.isAttached) {
        app.shell.activateById(tab.id);
        return;
      }
      // Notebook 7's main area holds its one document and takes no other
      // widget: a dialog instead
      tab.dispose();
      timeline = null;
      const body = new TimelineView();
      body.showTimeline(src, title);
      void showDialog({
        title: body.title.label,
        body,
        buttons: [Dialog.okButton({ label: 'Close' })]
      });
    };
    const panel = new GpucellPanel({
      start: args => void link?.send(start(args)),
      stop: () => void link?.send(stop()),
      select: ticks => void link?.select(ticks),
      cancel: cell => void link?.send(cancel(cell)),
      openTimeline
    });
    panel.title.icon = gpuIcon;
    const status = new StatusItem(() => {
      void app.commands.execute(OPEN_COMMAND);
    });

    const render = (s: Snapshot) => {
      const vm = viewModel(s);
      panel.render(vm);
      status.render(vm);
    };
    link = new PanelLink(render);
    render(link.snapshot);

    registerOpenCommand(
      app.commands,
      () => {
        link?.retry();
        if (!panel.isAttached) {
          app.shell.add(panel, 'right', { rank: 1000 });
        }
        app.shell.activateById(PANEL_ID);
      },
      palette,
      mainMenu?.viewMenu ?? null,
      gpuIcon
    );
    app.shell.add(panel, 'right', { rank: 1000 });
    if (statusBar) {
      statusBar.registerStatusItem('gpucell:status', {
        item: status,
        align: 'left',
        rank: 100
      });
    }

    new Follower(tracker, link);
    console.debug('gpucell: the GPU cluster panel is active');
  }
};

export default plugin;
