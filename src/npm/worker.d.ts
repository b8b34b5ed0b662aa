/** Serve the Florence2Worker protocol on `scope` (done automatically when imported inside a worker). */
export function expose(scope?: { postMessage(message: unknown): void; addEventListener(type: "message", listener: (ev: MessageEvent) => void): void }): void;
