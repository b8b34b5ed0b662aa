/** The part of a 2D canvas context `drawResult` uses: CanvasRenderingContext2D and
 * OffscreenCanvasRenderingContext2D are ones (declared structurally, so a Node.js project without the
 * DOM lib type-checks too). */
export interface DrawContext2D {
  readonly canvas?: { readonly width: number; readonly height: number } | null;
  lineJoin: string;
  lineWidth: number;
  strokeStyle: unknown;
  fillStyle: unknown;
  globalAlpha: number;
  font: string;
  save(): void;
  restore(): void;
  beginPath(): void;
  moveTo(x: number, y: number): void;
  lineTo(x: number, y: number): void;
  closePath(): void;
  stroke(): void;
  fill(): void;
  strokeRect(x: number, y: number, w: number, h: number): void;
  fillRect(x: number, y: number, w: number, h: number): void;
  clearRect(x: number, y: number, w: number, h: number): void;
  fillText(text: string, x: number, y: number): void;
  measureText(text: string): { readonly width: number };
}

/** A canvas (HTMLCanvasElement, OffscreenCanvas) whose 2D context `drawResult` draws on. */
export interface DrawCanvas {
  getContext(contextId: "2d"): DrawContext2D | null;
}

export interface DrawOptions {
  /** Canvas pixels per image pixel (default: `canvas.width / imageWidth` when `imageWidth` is given, else 1). */
  scale?: number;
  /** The image's width in pixels: the scale is the canvas width over it. */
  imageWidth?: number;
  /** CSS colours, one per instance in turn (default `DRAW_COLORS`). */
  colors?: readonly string[];
  /** Line width in canvas pixels (2.5). */
  lineWidth?: number;
  /** Label font size in canvas pixels (13). */
  fontSize?: number;
  /** Label font family (`"system-ui, sans-serif"`). */
  font?: string;
  /** Draw the labels (true). */
  labels?: boolean;
  /** Polygon fill opacity, 0 to 1 (0.33; 0: outlines only). */
  fillAlpha?: number;
  /** Clear the canvas first (false: draw over what it shows, e.g. the image). */
  clear?: boolean;
}

/** The default colours. */
export declare const DRAW_COLORS: readonly string[];

/**
 * Draws a task's answer over its image: boxes with labels (`<OD>`, `<DENSE_REGION_CAPTION>`, grounding,
 * ...), OCR quadrilaterals with their text, segmentation polygons (outlined and filled). `output` is a
 * `runTask` result, its `result` map or the task's value. Returns how many instances were drawn;
 * coordinates that are not finite numbers are skipped.
 */
export declare function drawResult(target: DrawCanvas | DrawContext2D, output: unknown, options?: DrawOptions): number;

/**
 * The region input of the region tasks for a box `[x1, y1, x2, y2]` in the pixels of a `width` x `height`
 * image: `"<loc_X1><loc_Y1><loc_X2><loc_Y2>"`, quantized as the processor does
 * (`floor(coord / (size / 1000))`, 0..999), corners ordered.
 */
export declare function regionTokens(box: readonly number[], width: number, height: number): string;
