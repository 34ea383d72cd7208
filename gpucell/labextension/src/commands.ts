/**
 * The command that opens the GPU cluster panel, and where it is offered: the
 * command palette and the View menu (besides the status bar and side bar).
 *
 * Written against the few members it uses, so jest checks the registration
 * with plain objects.
 */

export const OPEN_COMMAND = 'gpucell:open-panel';
export const OPEN_LABEL = 'GPU cluster (gpucell)';
export const OPEN_CAPTION =
  "Show gpucell's GPU cluster panel for the active notebook's kernel";
export const PALETTE_CATEGORY = 'gpucell';
/** the View menu group's rank: after Lab's own groups */
export const VIEW_MENU_RANK = 100;

export interface CommandsLike<Icon> {
  addCommand(
    id: string,
    options: {
      label: string;
      caption: string;
      icon?: Icon;
      execute: () => unknown;
    }
  ): unknown;
}

export interface PaletteLike {
  addItem(options: { command: string; category: string }): unknown;
}

export interface ViewMenuLike {
  addGroup(items: Array<{ command: string }>, rank?: number): unknown;
}

/** Register the open command, and offer it where a user looks for it. */
export function registerOpenCommand<Icon>(
  commands: CommandsLike<Icon>,
  execute: () => void,
  palette: PaletteLike | null,
  viewMenu: ViewMenuLike | null,
  icon?: Icon
): void {
  commands.addCommand(OPEN_COMMAND, {
    label: OPEN_LABEL,
    caption: OPEN_CAPTION,
    icon,
    execute
  });
  palette?.addItem({ command: OPEN_COMMAND, category: PALETTE_CATEGORY });
  viewMenu?.addGroup([{ command: OPEN_COMMAND }], VIEW_MENU_RANK);
}
